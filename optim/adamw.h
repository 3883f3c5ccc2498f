// AdamW (decoupled weight decay, PyTorch's formulation) over a model's parameters, with global-norm
// gradient clipping. Ling's settings (docs/architecture.md §8.1-8.2): betas 0.9 / 0.95, eps 1e-8,
// weight decay 0.1 on matrices and none on norm weights, clipping at 1.0.
//
// The update runs over the flat parameter buffer (optim/flat_parameters.h): the moments are two more
// buffers of the same layout, and a step is one fused kernel pass per stretch of parameters that share
// a weight decay, the gradient norm one reduction per stretch that holds gradients.
//
// Sharded (ZeRO-2 style, dist/edit.h): with shards > 1 this optimiser owns one shard of the flat
// buffers; its moments cover that shard only, and it reads the gradients and updates the values there
// alone. The gradient norm is then this shard's part; the caller completes it across the shards.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "optim/flat_parameters.h"

namespace lt {

struct AdamWSettings {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  // Moments of the layout of `params` (of its shard `shard` of `shards`), which must outlive the optimiser.
  AdamW(FlatParameters& params, AdamWSettings settings, int shard = 0, int shards = 1);

  // The sum of the squared gradients of the owned stretch (parameters without a gradient count as zero),
  // a deterministic reduction over the flat gradient buffer, in parts left on the gradients' device (one
  // per run of the stretch, [R]) so that a step reads them back with its other figures;
  // sum_of_parts adds a host copy of them up in order.
  Tensor grad_sum_squares_parts() const;
  static double sum_of_parts(const Tensor& host_parts);
  double grad_sum_squares() const { return sum_of_parts(grad_sum_squares_parts().to(Device::cpu())); }
  // Given the gradients' global norm, makes the next step() use them scaled by max_norm / norm when
  // norm > max_norm (the scale rides along in the AdamW kernel: no pass of its own).
  void clip_to(double norm, double max_norm);
  // One update at learning rate lr. Parameters without a gradient are left untouched. values_bf16, where
  // given (bf16, the shape of the flat values), receives the owned values' new bf16 rounding in the same
  // pass: the weights' copy for the next step's bf16 matmuls (tensor/bf16_shadow.h).
  void step(double lr, const Tensor& values_bf16 = Tensor());

  int64_t steps_taken() const { return t_; }
  const FlatParameters::Range& owned() const { return owned_; }
  AdamWSettings& settings() { return settings_; }  // a later stage may change the weight decay
  // Moments by parameter name ("<name>.exp_avg", "<name>.exp_avg_sq"), for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state() const;
  // The parameter a moment of state() belongs to: "<name>.exp_avg" -> "<name>".
  static std::string moment_parameter(const std::string& moment_name);
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                  const std::string& origin);
  // The owned shard's moments as two flat tensors ("exp_avg", "exp_avg_sq"), for per-rank checkpoints
  // of a sharded optimiser.
  std::vector<std::pair<std::string, Tensor>> shard_state() const;
  void load_shard_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps_taken,
                        const std::string& origin);

 private:
  FlatParameters& params_;
  FlatParameters::Range owned_;  // the stretch of the flat buffers this optimiser updates
  Tensor exp_avg_, exp_avg_sq_;
  AdamWSettings settings_;
  int64_t t_ = 0;
  double grad_scale_ = 1.0;  // set by clip_to for the next step
};

// Moments by parameter name ("<name>.exp_avg", "<name>.exp_avg_sq", as AdamW::state() names them) into
// two buffers over the whole flat layout of `params`: AdamW::load_state's, and a checkpoint's moments
// read whole for a resume on another layout (trainer/checkpoint.h). Fails naming `origin` on a missing
// tensor or a shape the model does not have.
void copy_named_moments(const FlatParameters& params, const std::map<std::string, Tensor>& named, Tensor& exp_avg,
                        Tensor& exp_avg_sq, const std::string& origin);

}  // namespace lt
