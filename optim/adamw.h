// AdamW (decoupled weight decay, PyTorch's formulation) over a model's parameters, with global-norm
// gradient clipping. Ling's settings (spec/ling.md §11.2): betas 0.9 / 0.95, eps 1e-8, weight decay
// 0.1 on matrices and none on norm weights, clipping at 1.0.
#pragma once
#include <string>
#include <vector>

#include "nn/module.h"

namespace lt {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  AdamW(std::vector<Parameter> params, AdamWSettings settings);

  // Global L2 norm of all gradients (parameters without a gradient count as zero), summed in
  // parameter order so the value is deterministic.
  double grad_norm() const;
  // Scales every gradient by max_norm / norm when norm > max_norm; returns the pre-clip norm.
  double clip_grad_norm(double max_norm);
  // One update at learning rate lr. Parameters without a gradient are left untouched.
  void step(double lr);
  void zero_grad();

  int64_t steps_taken() const { return t_; }
  // Moments by parameter name ("<name>.exp_avg", "<name>.exp_avg_sq") and the step count, for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                  const std::string& origin);
  const std::vector<Parameter>& params() const { return params_; }

 private:
  std::vector<Parameter> params_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  AdamWSettings settings_;
  int64_t t_ = 0;
};

}  // namespace lt
