#include "optim/adamw.h"

#include <cmath>
#include <map>

#include "tensor/kernels.h"

namespace lt {

AdamW::AdamW(std::vector<Parameter> params, AdamWSettings settings)
    : params_(std::move(params)), settings_(settings) {
  for (const Parameter& p : params_) {
    exp_avg_.push_back(Tensor::zeros_like(p.value->value()));
    exp_avg_sq_.push_back(Tensor::zeros_like(p.value->value()));
  }
}

double AdamW::grad_norm() const {
  double total = 0;
  for (const Parameter& p : params_) {
    const Tensor& g = p.value->grad();
    if (!g.defined()) continue;
    Tensor sq = Tensor::empty({1}, g.dtype(), g.device());
    kernels::sum_squares(g, sq);
    total += sq.item();
  }
  return std::sqrt(total);
}

double AdamW::clip_grad_norm(double max_norm) {
  const double norm = grad_norm();
  if (max_norm > 0 && norm > max_norm) {
    const double factor = max_norm / (norm + 1e-6);  // PyTorch's clip_grad_norm_ adds 1e-6 too
    for (const Parameter& p : params_) {
      Tensor g = p.value->grad();
      if (g.defined()) kernels::scale(g, factor, g);
    }
  }
  return norm;
}

void AdamW::step(double lr) {
  ++t_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Parameter& p = params_[i];
    const Tensor& g = p.value->grad();
    if (!g.defined()) continue;
    kernels::AdamWStep s{lr, settings_.beta1, settings_.beta2, settings_.eps,
                         p.weight_decay ? settings_.weight_decay : 0.0, t_};
    kernels::adamw_step(p.value->value(), g, exp_avg_[i], exp_avg_sq_[i], s);
  }
}

void AdamW::zero_grad() {
  for (const Parameter& p : params_) p.value->zero_grad();
}

std::vector<std::pair<std::string, Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

void AdamW::load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                       const std::string& origin) {
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [suffix, slot] : {std::pair{".exp_avg", &exp_avg_[i]}, std::pair{".exp_avg_sq", &exp_avg_sq_[i]}}) {
      const std::string name = params_[i].name + suffix;
      auto it = by_name.find(name);
      LT_CHECK(it != by_name.end(), origin, ": optimiser state has no tensor '", name, "'");
      LT_CHECK(it->second.shape() == slot->shape(), origin, ": optimiser tensor '", name, "' has shape ",
               shape_str(it->second.shape()), ", the model needs ", shape_str(slot->shape()));
      slot->copy_from(it->second.to(slot->dtype()).to(slot->device()));
    }
  }
  t_ = steps_taken;
}

}  // namespace lt
