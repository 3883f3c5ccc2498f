#include "model/hf_names.h"

#include <set>

namespace lt {
namespace {

const std::string kStackedMarker = ".mlp.experts.";

// "model.layers.3.mlp.experts.gate_proj.weight" -> prefix "model.layers.3.mlp.experts.", leaf
// "gate_proj.weight"; false for parameters that are not stacked experts.
bool split_stacked(const std::string& name, std::string& prefix, std::string& leaf) {
  const size_t at = name.find(kStackedMarker);
  if (at == std::string::npos) return false;
  prefix = name.substr(0, at + kStackedMarker.size());
  leaf = name.substr(at + kStackedMarker.size());
  return true;
}

}  // namespace

NamedTensors hf_state_dict(LingForCausalLM& model) {
  NamedTensors out;
  for (const Parameter& p : model.parameters()) {
    const Tensor& value = p.value->value();
    std::string prefix, leaf;
    if (!split_stacked(p.name, prefix, leaf)) {
      out.emplace_back(p.name, value);
      continue;
    }
    const Shape expert_shape{value.dim(1), value.dim(2)};
    for (int64_t e = 0; e < value.dim(0); ++e)
      out.emplace_back(prefix + std::to_string(e) + "." + leaf, value.narrow(e, 1).reshape(expert_shape));
  }
  return out;
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
  for (const auto& [name, tensor] : file.tensors)
    LT_CHECK(expected.count(name), file.path, ": tensor '", name, "' does not belong to this model config");
}

}  // namespace lt
