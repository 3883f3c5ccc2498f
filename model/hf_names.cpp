#include "model/hf_names.h"

#include <set>

namespace lt {
namespace {

const std::string kStackedMarker = ".mlp.experts.";

// "model.layers.3.mlp.experts.down_proj.weight" -> prefix "model.layers.3.mlp.experts.", leaf
// "down_proj.weight"; false for parameters that are not stacked experts.
bool split_stacked(const std::string& name, std::string& prefix, std::string& leaf) {
  const size_t at = name.find(kStackedMarker);
  if (at == std::string::npos) return false;
  prefix = name.substr(0, at + kStackedMarker.size());
  leaf = name.substr(at + kStackedMarker.size());
  return true;
}

const std::string kGateUp = "gate_up_proj.weight";

// One matrix under its Hugging Face name(s): a fused gate_up [2I, H] as its two halves of rows, each a view.
void add_matrix(NamedTensors& out, const std::string& name, const Tensor& matrix) {
  const bool fused = name.size() >= kGateUp.size() && name.compare(name.size() - kGateUp.size(), kGateUp.size(),
                                                                   kGateUp) == 0;
  if (!fused) {
    out.emplace_back(name, matrix);
    return;
  }
  const std::string prefix = name.substr(0, name.size() - kGateUp.size());
  const int64_t I = matrix.dim(0) / 2;
  out.emplace_back(prefix + "gate_proj.weight", matrix.narrow(0, I));
  out.emplace_back(prefix + "up_proj.weight", matrix.narrow(I, I));
}

}  // namespace

NamedTensors hf_named(const NamedTensors& by_parameter_name, int64_t first_expert) {
  NamedTensors out;
  for (const auto& [name, value] : by_parameter_name) {
    std::string prefix, leaf;
    if (!split_stacked(name, prefix, leaf)) {
      add_matrix(out, name, value);
      continue;
    }
    const Shape expert_shape{value.dim(1), value.dim(2)};
    for (int64_t e = 0; e < value.dim(0); ++e)
      add_matrix(out, prefix + std::to_string(first_expert + e) + "." + leaf, value.narrow(e, 1).reshape(expert_shape));
  }
  return out;
}

NamedTensors hf_state_dict(LingForCausalLM& model) {
  NamedTensors values;
  for (const Parameter& p : model.parameters()) values.emplace_back(p.name, p.value->value());
  return hf_named(values, model.expert_slice().first(model.config().num_experts));
}

bool is_stacked_experts(const std::string& parameter_name) {
  std::string prefix, leaf;
  return split_stacked(parameter_name, prefix, leaf);
}

Tensor held_part(const LingForCausalLM& model, const std::string& parameter_name, const Tensor& whole) {
  const ExpertSlice& slice = model.expert_slice();
  if (slice.ranks == 1 || !is_stacked_experts(parameter_name)) return whole;
  const int64_t E = model.config().num_experts;
  return whole.narrow(slice.first(E), slice.held(E));
}

void load_hf_state_dict(LingForCausalLM& model, const SafetensorsFile& file) {
  std::set<std::string> expected;
  for (auto& [name, view] : hf_state_dict(model)) {
    // Released Ling checkpoints are bf16; any floating dtype is converted to the parameter's.
    const Tensor& stored = file.get(name);
    LT_CHECK(stored.shape() == view.shape(), file.path, ": tensor '", name, "' has shape ", shape_str(stored.shape()),
             ", the config expects ", shape_str(view.shape()));
    LT_CHECK(is_floating(stored.dtype()), file.path, ": tensor '", name, "' is ", dtype_name(stored.dtype()),
             ", expected a floating dtype");
    Tensor destination = view;  // a view into the parameter: copying fills the parameter
    destination.copy_from(stored.to(destination.dtype()).to(destination.device()));
    expected.insert(name);
  }
  // Under expert parallelism the other ranks' experts are in the file too: all E experts' names (from
  // stand-ins of [E, 2, 1]: a name depends on the expert's number and the projection only).
  std::set<std::string> whole_model;
  if (model.expert_slice().ranks > 1) {
    NamedTensors all_experts;
    for (const Parameter& p : model.parameters())
      if (is_stacked_experts(p.name))
        all_experts.emplace_back(p.name, Tensor::empty({model.config().num_experts, 2, 1}));
    for (const auto& [name, view] : hf_named(all_experts)) whole_model.insert(name);
  }
  for (const auto& [name, tensor] : file.tensors)
    LT_CHECK(expected.count(name) || whole_model.count(name), file.path, ": tensor '", name,
             "' does not belong to this model config");
}

}  // namespace lt
