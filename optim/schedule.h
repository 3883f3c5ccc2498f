// Learning-rate schedules (docs/architecture.md §8.3). Ling-Plus: linear warmup to the peak, constant,
// and the peak halved once a fraction (60%) of the training tokens is consumed ("wsd"). Also cosine
// decay and the inverse-square-root anneal of Ling's last stage (§9.1): lr(s) = peak / sqrt(1 + s / s0)
// after warmup, with s0 chosen so that the last step reaches min_lr (the report's exact
// parametrisation is UNVERIFIED).
#pragma once
#include <cstdint>
#include <string>

namespace lt {

struct LRSchedule {
  std::string kind = "wsd";  // "wsd", "cosine", "inverse_sqrt", "constant"
  double peak = 3e-3;
  double min_lr = 3e-5;           // cosine and inverse_sqrt end here
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double halve_at_fraction = 0.6;  // wsd: fraction of training tokens after which lr = peak / 2

  // lr for optimiser step `step` (0-based), given the fraction of training tokens consumed before it.
  double at(int64_t step, double token_fraction) const;
  void validate() const;  // throws lt::Error on an unknown kind or inconsistent values
};

// Batch-size warmup: the number of sequences per optimiser step ramps linearly from `start` to
// `final` over `ramp_steps` steps, then stays at `final` (docs/architecture.md §8.4; ramp shape
// UNVERIFIED).
struct BatchRamp {
  int64_t start = 0, final = 0, ramp_steps = 0;
  int64_t at(int64_t step) const;
};

}  // namespace lt
