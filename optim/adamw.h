// AdamW (decoupled weight decay, PyTorch's formulation) over a model's parameters, with global-norm
// gradient clipping. Ling's settings (spec/ling.md §11.2): betas 0.9 / 0.95, eps 1e-8, weight decay
// 0.1 on matrices and none on norm weights, clipping at 1.0.
//
// The optimiser lays the parameters out flat: their values move into one contiguous buffer (each
// parameter's Variable becomes a view of it), their gradients get one preallocated buffer that the
// backward writes into directly, and the two moments are two more buffers of the same layout. The
// decayed parameters come first, the others after, so a step is one fused kernel pass per weight-decay
// group and the gradient norm one reduction, instead of a few passes per parameter.
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
  // The parameters must share one dtype and device; their values are moved into the flat buffer.
  AdamW(std::vector<Parameter> params, AdamWSettings settings);

  // Global L2 norm of all gradients (parameters without a gradient count as zero), a deterministic
  // reduction over the flat gradient buffer.
  double grad_norm() const;
  // Returns the pre-clip norm, and when norm > max_norm makes the next step() use the gradients
  // scaled by max_norm / norm (the scale rides along in the AdamW kernel: no pass of its own).
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
  // A stretch [begin, end) of the flat buffers one kernel call covers: consecutive parameters that all
  // hold a gradient (and, for the AdamW step, share a weight decay), with the zero padding between them.
  struct Run {
    int64_t begin = 0, end = 0;
    bool weight_decay = false;  // of the first parameter (of all of them when split by decay)
  };
  // The runs of this step in layout order: normally the whole buffer, or one per weight-decay group.
  std::vector<Run> runs(bool split_by_decay) const;
  Tensor view(const Tensor& flat, size_t param) const;  // parameter i's slice, in its shape

  std::vector<Parameter> params_;  // in layout order: decayed first
  std::vector<int64_t> offsets_;   // each parameter's first element in the flat buffers
  Tensor values_, grads_, exp_avg_, exp_avg_sq_;
  AdamWSettings settings_;
  int64_t t_ = 0;
  double grad_scale_ = 1.0;  // set by clip_grad_norm for the next step
};

}  // namespace lt
