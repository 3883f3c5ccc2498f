#include "optim/flat_parameters.h"

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

std::vector<int64_t> FlatParameters::offsets_of(const std::vector<int64_t>& sizes, int64_t* end) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const int64_t size : sizes) {
    offsets.push_back(total);
    total = align_up(total + size);
  }
  if (end != nullptr) *end = total;
  return offsets;
}

FlatParameters::FlatParameters(std::vector<Parameter> params, int shards) {
  LT_CHECK(shards >= 1, "flat parameters: shards must be >= 1, got ", shards);
  const DType dtype = params.empty() ? DType::F32 : params.front().value->value().dtype();
  const Device device = params.empty() ? Device::cpu() : params.front().value->value().device();
  std::vector<int64_t> sizes;
  for (const Parameter& p : params) sizes.push_back(p.value->value().numel());
  int64_t total = 0;
  const std::vector<int64_t> offsets = offsets_of(sizes, &total);
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i];
    const Tensor& v = p.value->value();
    LT_CHECK(v.dtype() == dtype && v.device() == device, "flat parameters: ", p.name, " is ", v.str(),
             ", the first one is ", dtype_name(dtype), " on ", device.str(), ": one dtype and device for all");
    params_.push_back({p, {p.name, offsets[i], offsets[i] + v.numel()}});
    const std::string layer = layer_of(p.name);
    if (layers_.empty() || layers_.back().name != layer) layers_.push_back({layer, offsets[i], offsets[i]});
    layers_.back().end = i + 1 < params.size() ? offsets[i + 1] : total;
  }
  // Each shard a whole number of aligned blocks; the last layer's range takes the tail padding.
  const int64_t shard_multiple = kAlignElements * shards;
  total = (total + shard_multiple - 1) / shard_multiple * shard_multiple;
  if (!layers_.empty()) layers_.back().end = total;
  values_ = Tensor::zeros({total}, dtype, device);
  grads_ = Tensor::zeros({total}, dtype, device);
  for (size_t i = 0; i < params_.size(); ++i) {
    Variable& p = *params_[i].parameter.value;
    Tensor flat_value = view(values_, i);
    flat_value.copy_from(p.value());
    p.value() = flat_value;
    p.set_grad_buffer(view(grads_, i));
  }
  // The parameters' former storage would otherwise sit in the allocator's cache for the whole run,
  // doubling the parameters' share of the resident memory.
  allocator_for(device).empty_cache();
}

FlatParameters::Range FlatParameters::shard(int index, int count) const {
  LT_CHECK(count >= 1 && index >= 0 && index < count && numel() % (kAlignElements * count) == 0,
           "flat parameters: shard ", index, " of ", count, " does not split ", numel(), " elements into aligned shards");
  const int64_t size = numel() / count;
  return {"shard " + std::to_string(index) + "/" + std::to_string(count), index * size, (index + 1) * size};
}

Tensor FlatParameters::view(const Tensor& flat, size_t param) const {
  const Range& r = params_[param].range;
  return flat.narrow(r.begin, r.size()).reshape(params_[param].parameter.value->value().shape());
}

std::vector<FlatParameters::Run> FlatParameters::runs_with_grad(bool split_by_decay) const {
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

void FlatParameters::zero_grad() {
  for (const ParameterRange& p : params_) p.parameter.value->zero_grad();
}

}  // namespace lt
