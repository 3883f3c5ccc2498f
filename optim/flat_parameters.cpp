#include "optim/flat_parameters.h"

#include <algorithm>
#include <cctype>

#include "tensor/allocator.h"

namespace lt {

namespace {
// Each parameter starts on a 16-element boundary of the flat buffers (64 bytes in f32), as a tensor of
// its own would: the kernels' vector loads stay aligned. The padding stays zero in every buffer, and AdamW
// maps zero moments and a zero gradient to a zero update, so runs may cover it.
constexpr int64_t kAlignElements = 16;
int64_t align_up(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }

bool is_number(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// Where parameters of these sizes (in order) start in a flat layout, and its end: each starts aligned (16
// elements), as a tensor of its own would.
std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes, int64_t* end) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const int64_t size : sizes) {
    offsets.push_back(total);
    total = align_up(total + size);
  }
  if (end != nullptr) *end = total;
  return offsets;
}

}  // namespace

std::string FlatParameters::layer_of(const std::string& name) {
  size_t end_of_layer = std::string::npos;
  for (size_t start = 0; start < name.size();) {
    const size_t dot = name.find('.', start);
    const size_t end = dot == std::string::npos ? name.size() : dot;
    if (is_number(name.substr(start, end - start))) end_of_layer = end;
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (end_of_layer != std::string::npos) return name.substr(0, end_of_layer);
  const size_t last_dot = name.rfind('.');
  return last_dot == std::string::npos ? name : name.substr(0, last_dot);
}


FlatParameters::Layout FlatParameters::layout_of(const std::vector<std::string>& names,
                                                 const std::vector<int64_t>& sizes, int shards,
                                                 const LayerShards& layer_shards) {
  LT_CHECK(shards >= 1, "flat parameters: shards must be >= 1, got ", shards);
  const bool sharded = layer_shards.ranks > 0;
  LT_CHECK(!sharded || (layer_shards.rank >= 0 && layer_shards.rank < layer_shards.ranks && shards == 1 &&
                        layer_shards.expert_rank >= 0 && layer_shards.expert_rank < layer_shards.expert_ranks),
           "flat parameters: layer part ", layer_shards.rank, " of ", layer_shards.ranks, " (experts' ",
           layer_shards.expert_rank, " of ", layer_shards.expert_ranks, ") with ", shards, " optimiser shards");
  Layout out;
  int64_t total = 0;
  std::vector<int64_t> offsets = offsets_of(sizes, &total);
  // Under layer sharding each unit starts where the layout splits into its aligned parts: its parameters
  // move up by the padding before it.
  auto round_up = [](int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; };
  int64_t shift = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string layer = layer_of(names[i]);
    const bool new_layer = out.layers.empty() || out.layers.back().name != layer;
    const bool experts = sharded && layer_shards.is_experts && layer_shards.is_experts(names[i]);
    if (sharded && (new_layer || out.units.back().experts != experts)) {
      Unit unit;
      unit.layer = new_layer ? out.layers.size() : out.layers.size() - 1;
      unit.experts = experts;
      unit.part = experts ? layer_shards.expert_rank : layer_shards.rank;
      unit.parts = experts ? layer_shards.expert_ranks : layer_shards.ranks;
      shift = round_up(offsets[i] + shift, kAlignElements * unit.parts) - offsets[i];
      unit.range = {layer, offsets[i] + shift, offsets[i] + shift};
      if (!out.units.empty()) out.units.back().range.end = unit.range.begin;
      out.units.push_back(unit);
    }
    offsets[i] += shift;
    out.parameters.push_back({names[i], offsets[i], offsets[i] + sizes[i]});
    out.unit_of.push_back(sharded ? out.units.size() - 1 : 0);
    if (new_layer) {
      if (!out.layers.empty()) out.layers.back().end = offsets[i];
      out.layers.push_back({layer, offsets[i], offsets[i]});
    }
  }
  total += shift;
  // Each shard a whole number of aligned blocks (and the last unit a whole number of its parts); the last
  // layer's range takes the tail padding.
  total = round_up(total, kAlignElements * shards * (out.units.empty() ? 1 : out.units.back().parts));
  if (!out.layers.empty()) out.layers.back().end = total;
  out.numel = out.held_numel = total;
  if (sharded) {
    out.units.back().range.end = total;
    out.held_numel = 0;
    for (Unit& unit : out.units) {
      const int64_t size = unit.range.size() / unit.parts;
      unit.held = {unit.range.name, out.held_numel, out.held_numel + size};
      out.held_numel += size;
    }
  }
  return out;
}

FlatParameters::FlatParameters(std::vector<Parameter> params, int shards, LayerShards layer_shards) {
  const DType dtype = params.empty() ? DType::F32 : params.front().value->value().dtype();
  const Device device = params.empty() ? Device::cpu() : params.front().value->value().device();
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (const Parameter& p : params) {
    const Tensor& v = p.value->value();
    LT_CHECK(v.dtype() == dtype && v.device() == device, "flat parameters: ", p.name, " is ", v.str(),
             ", the first one is ", dtype_name(dtype), " on ", device.str(), ": one dtype and device for all");
    names.push_back(p.name);
    sizes.push_back(v.numel());
  }
  Layout layout = layout_of(names, sizes, shards, layer_shards);
  for (size_t i = 0; i < params.size(); ++i) params_.push_back({params[i], layout.parameters[i], layout.unit_of[i]});
  layers_ = std::move(layout.layers);
  units_ = std::move(layout.units);
  layout_numel_ = layout.numel;
  const bool sharded = !units_.empty();
  for (const Unit& unit : units_) {
    unit_values_.push_back(Tensor::zeros({unit.range.size()}, dtype, device));
    unit_grads_.push_back(Tensor::empty({unit.range.size()}, dtype, device));
  }
  values_ = Tensor::zeros({layout.held_numel}, dtype, device);
  grads_ = Tensor::zeros({layout.held_numel}, dtype, device);
  for (size_t i = 0; i < params_.size(); ++i) {
    Variable& p = *params_[i].parameter.value;
    Tensor value, grad;
    if (sharded) {
      const size_t u = params_[i].unit;
      const int64_t in_unit = params_[i].range.begin - units_[u].range.begin;
      value = unit_values_[u].narrow(in_unit, params_[i].range.size()).reshape(p.value().shape());
      grad = unit_grads_[u].narrow(in_unit, params_[i].range.size()).reshape(p.value().shape());
    } else {
      value = view(values_, i);
      grad = view(grads_, i);
    }
    value.copy_from(p.value());
    p.value() = value;
    p.set_grad_buffer(grad);
  }
  // Each process keeps its part of every unit; the whole units' memory goes until they are gathered.
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    values_.narrow(unit.held.begin, unit.held.size())
        .copy_from(unit_values_[u].narrow(unit.part * unit.held.size(), unit.held.size()));
    unit_values_[u].storage().release();
    unit_grads_[u].storage().release();
  }
  // The parameters' former storage would otherwise sit in the allocator's cache for the whole run,
  // doubling the parameters' share of the resident memory.
  allocator_for(device).empty_cache();
}

void FlatParameters::hold(const Tensor& whole, Tensor& held) const {
  LT_CHECK(whole.numel() == layout_numel_ && held.numel() == numel(), "flat parameters: hold() takes the whole ",
           "layout's ", layout_numel_, " elements into the ", numel(), " held, got ", whole.numel(), " and ",
           held.numel());
  if (!sharded_by_layer()) {
    held.copy_from(whole);
    return;
  }
  for (const Unit& unit : units_)
    held.narrow(unit.held.begin, unit.held.size())
        .copy_from(whole.narrow(unit.range.begin + unit.part * unit.held.size(), unit.held.size()));
}

FlatParameters::Range FlatParameters::shard(int index, int count) const {
  LT_CHECK(count >= 1 && index >= 0 && index < count && numel() % (kAlignElements * count) == 0,
           "flat parameters: shard ", index, " of ", count, " does not split ", numel(), " elements into aligned shards");
  const int64_t size = numel() / count;
  return {"shard " + std::to_string(index) + "/" + std::to_string(count), index * size, (index + 1) * size};
}

Tensor FlatParameters::view(const Tensor& flat, size_t param) const {
  LT_CHECK(flat.numel() == layout_numel_, "flat parameters: a view of ", params_[param].parameter.name, " needs a ",
           "buffer of the whole layout (", layout_numel_, " elements), got ", flat.numel());
  const Range& r = params_[param].range;
  return flat.narrow(r.begin, r.size()).reshape(params_[param].parameter.value->value().shape());
}

int64_t FlatParameters::held_elements(const Range& range) const {
  if (!sharded_by_layer()) return range.size();
  int64_t held = 0;
  for (const Unit& unit : units_) {
    const int64_t begin = unit.range.begin + unit.part * unit.held.size();
    held += std::max<int64_t>(0, std::min(range.end, begin + unit.held.size()) - std::max(range.begin, begin));
  }
  return held;
}

std::vector<FlatParameters::Run> FlatParameters::layout_runs_with_grad(bool split_by_decay) const {
  std::vector<Run> out;
  size_t previous = params_.size();  // the last parameter added to out.back()
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i].parameter;
    if (!p.value->grad().defined()) continue;
    const bool same_decay = out.empty() || out.back().weight_decay == p.weight_decay;
    if (!out.empty() && previous + 1 == i && (same_decay || !split_by_decay)) out.back().end = params_[i].range.end;
    else out.push_back({params_[i].range.begin, params_[i].range.end, p.weight_decay});
    previous = i;
  }
  return out;
}

std::vector<FlatParameters::Run> FlatParameters::runs_with_grad(bool split_by_decay) const {
  std::vector<Run> layout = layout_runs_with_grad(split_by_decay);
  if (!sharded_by_layer()) return layout;
  // Each layout run cut to this process's part of every unit it crosses, moved to where that part is held;
  // pieces that meet in the held buffers join (the held parts of consecutive units are adjacent).
  std::vector<Run> out;
  size_t u = 0;
  for (const Run& run : layout) {
    while (units_[u].range.end <= run.begin) ++u;
    for (size_t k = u; k < units_.size() && units_[k].range.begin < run.end; ++k) {
      const Unit& unit = units_[k];
      const int64_t part_begin = unit.range.begin + unit.part * unit.held.size();
      const int64_t from = std::max(run.begin, part_begin), to = std::min(run.end, part_begin + unit.held.size());
      if (from >= to) continue;
      const Run piece{unit.held.begin + from - part_begin, unit.held.begin + to - part_begin, run.weight_decay};
      if (!out.empty() && out.back().end == piece.begin &&
          (out.back().weight_decay == piece.weight_decay || !split_by_decay))
        out.back().end = piece.end;
      else
        out.push_back(piece);
    }
  }
  return out;
}

void FlatParameters::zero_grad() {
  for (const ParameterRange& p : params_) p.parameter.value->zero_grad();
  if (sharded_by_layer()) grads_.zero_();
}

}  // namespace lt
