#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "tensor/allocator.h"
#include "tensor/kernels.h"

namespace lt {

namespace {
// Each parameter starts on a 16-element boundary of the flat buffers (64 bytes in f32), as a tensor of
// its own would: the kernels' vector loads stay aligned. The padding stays zero in every buffer, and AdamW
// maps zero moments and a zero gradient to a zero update, so runs may cover it.
constexpr int64_t kAlignElements = 16;
int64_t align_up(int64_t n) { return (n + kAlignElements - 1) / kAlignElements * kAlignElements; }
}  // namespace

AdamW::AdamW(std::vector<Parameter> params, AdamWSettings settings)
    : params_(std::move(params)), settings_(settings) {
  std::stable_partition(params_.begin(), params_.end(), [](const Parameter& p) { return p.weight_decay; });
  const DType dtype = params_.empty() ? DType::F32 : params_.front().value->value().dtype();
  const Device device = params_.empty() ? Device::cpu() : params_.front().value->value().device();
  int64_t total = 0;
  for (const Parameter& p : params_) {
    const Tensor& v = p.value->value();
    LT_CHECK(v.dtype() == dtype && v.device() == device, "AdamW: parameter ", p.name, " is ", v.str(),
             ", the first one is ", dtype_name(dtype), " on ", device.str(), ": one dtype and device for all");
    offsets_.push_back(total);
    total = align_up(total + v.numel());
  }
  values_ = Tensor::zeros({total}, dtype, device);
  grads_ = Tensor::zeros({total}, dtype, device);
  exp_avg_ = Tensor::zeros({total}, dtype, device);
  exp_avg_sq_ = Tensor::zeros({total}, dtype, device);
  for (size_t i = 0; i < params_.size(); ++i) {
    Variable& p = *params_[i].value;
    Tensor flat_value = view(values_, i);
    flat_value.copy_from(p.value());
    p.value() = flat_value;
    p.set_grad_buffer(view(grads_, i));
  }
  // The parameters' former storage would otherwise sit in the allocator's cache for the whole run,
  // doubling the parameters' share of the resident memory.
  allocator_for(device).empty_cache();
}

Tensor AdamW::view(const Tensor& flat, size_t param) const {
  const Tensor& value = params_[param].value->value();
  return flat.narrow(offsets_[param], value.numel()).reshape(value.shape());
}

std::vector<AdamW::Run> AdamW::runs(bool split_by_decay) const {
  std::vector<Run> out;
  size_t previous = params_.size();  // the last parameter added to out.back()
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].value->grad().defined()) continue;
    const int64_t begin = offsets_[i], end = begin + params_[i].value->value().numel();
    const bool same_decay = out.empty() || out.back().weight_decay == params_[i].weight_decay;
    if (!out.empty() && previous + 1 == i && (same_decay || !split_by_decay)) out.back().end = end;
    else out.push_back({begin, end, params_[i].weight_decay});
    previous = i;
  }
  return out;
}

double AdamW::grad_norm() const {
  double total = 0;
  for (const Run& run : runs(/*split_by_decay=*/false)) {
    Tensor sq = Tensor::empty({1}, grads_.dtype(), grads_.device());
    kernels::sum_squares(grads_.narrow(run.begin, run.end - run.begin), sq);
    total += sq.item();
  }
  return std::sqrt(total);
}

double AdamW::clip_grad_norm(double max_norm) {
  const double norm = grad_norm();
  // PyTorch's clip_grad_norm_ adds 1e-6 too.
  grad_scale_ = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
  return norm;
}

void AdamW::step(double lr) {
  ++t_;
  for (const Run& run : runs(/*split_by_decay=*/true)) {
    const int64_t n = run.end - run.begin;
    Tensor p = values_.narrow(run.begin, n), m = exp_avg_.narrow(run.begin, n), v = exp_avg_sq_.narrow(run.begin, n);
    const double decay = run.weight_decay ? settings_.weight_decay : 0.0;
    const kernels::AdamWStep s{lr, settings_.beta1, settings_.beta2, settings_.eps, decay, t_, grad_scale_};
    kernels::adamw_step(p, grads_.narrow(run.begin, n), m, v, s);
  }
  grad_scale_ = 1.0;
}

void AdamW::zero_grad() {
  for (const Parameter& p : params_) p.value->zero_grad();
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].name + ".exp_avg", view(exp_avg_, i));
    out.emplace_back(params_[i].name + ".exp_avg_sq", view(exp_avg_sq_, i));
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                       const std::string& origin) {
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [suffix, flat] : {std::pair{".exp_avg", &exp_avg_}, std::pair{".exp_avg_sq", &exp_avg_sq_}}) {
      const std::string name = params_[i].name + suffix;
      auto it = by_name.find(name);
      LT_CHECK(it != by_name.end(), origin, ": optimiser state has no tensor '", name, "'");
      Tensor slot = view(*flat, i);
      LT_CHECK(it->second.shape() == slot.shape(), origin, ": optimiser tensor '", name, "' has shape ",
               shape_str(it->second.shape()), ", the model needs ", shape_str(slot.shape()));
      slot.copy_from(it->second.to(slot.dtype()).to(slot.device()));
    }
  }
  t_ = steps_taken;
}

}  // namespace lt
