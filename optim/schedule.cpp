#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "tensor/error.h"

namespace lt {

void LRSchedule::validate() const {
  LT_CHECK(kind == "wsd" || kind == "cosine" || kind == "inverse_sqrt" || kind == "constant",
           "unknown lr schedule '", kind, "' (wsd, cosine, inverse_sqrt, constant)");
  LT_CHECK(peak > 0 && min_lr >= 0 && min_lr <= peak, "lr schedule: need 0 <= min_lr <= peak, peak > 0");
  LT_CHECK(warmup_steps >= 0 && total_steps >= 1, "lr schedule: need warmup_steps >= 0 and total_steps >= 1");
}

double LRSchedule::at(int64_t step, double token_fraction) const {
  if (step < warmup_steps) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const double decay_steps = static_cast<double>(std::max<int64_t>(total_steps - warmup_steps, 1));
  const double s = static_cast<double>(step - warmup_steps);
  if (kind == "constant") return peak;
  if (kind == "wsd") return token_fraction >= halve_at_fraction ? peak / 2 : peak;
  if (kind == "cosine") {
    const double progress = std::min(1.0, s / std::max(decay_steps - 1, 1.0));
    return min_lr + 0.5 * (peak - min_lr) * (1 + std::cos(3.141592653589793 * progress));
  }
  // inverse_sqrt: peak / sqrt(1 + s / s0) = min_lr at s = decay_steps - 1.
  const double ratio_sq = (peak / std::max(min_lr, 1e-30)) * (peak / std::max(min_lr, 1e-30));
  const double s0 = std::max(decay_steps - 1, 1.0) / std::max(ratio_sq - 1, 1e-12);
  return peak / std::sqrt(1 + s / s0);
}

int64_t BatchRamp::at(int64_t step) const {
  if (ramp_steps <= 0 || step >= ramp_steps || start <= 0) return final;
  const double f = static_cast<double>(step) / static_cast<double>(ramp_steps);
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(start + f * static_cast<double>(final - start))));
}

}  // namespace lt
