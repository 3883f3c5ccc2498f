// AdamW (decoupled weight decay, PyTorch's formulation) over a model's parameters, with global-norm
// gradient clipping. Ling's settings (docs/architecture.md §8.1-8.2): betas 0.9 / 0.95, eps 1e-8,
// weight decay 0.1 on matrices and none on norm weights, clipping at 1.0.
//
// The update runs over the flat parameter buffer (optim/flat_parameters.h): the moments are two more
// buffers of the same layout, and a step is one fused kernel pass per stretch of parameters that share
// a weight decay, the gradient norm one reduction per stretch that holds gradients.
#pragma once
#include <string>
#include <vector>

#include "optim/flat_parameters.h"

namespace lt {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  // Moments of the layout of `params`, which must outlive the optimiser.
  AdamW(FlatParameters& params, AdamWSettings settings);

  // Global L2 norm of all gradients (parameters without a gradient count as zero), a deterministic
  // reduction over the flat gradient buffer.
  double grad_norm() const;
  // Returns the pre-clip norm, and when norm > max_norm makes the next step() use the gradients
  // scaled by max_norm / norm (the scale rides along in the AdamW kernel: no pass of its own).
  double clip_grad_norm(double max_norm);
  // One update at learning rate lr. Parameters without a gradient are left untouched.
  void step(double lr);

  int64_t steps_taken() const { return t_; }
  AdamWSettings& settings() { return settings_; }  // a later stage may change the weight decay
  // Moments by parameter name ("<name>.exp_avg", "<name>.exp_avg_sq"), for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                  const std::string& origin);

 private:
  FlatParameters& params_;
  Tensor exp_avg_, exp_avg_sq_;
  AdamWSettings settings_;
  int64_t t_ = 0;
  double grad_scale_ = 1.0;  // set by clip_grad_norm for the next step
};

}  // namespace lt
