// What the Trainer tests share: random token batches, a constant learning rate, the flat weights.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/random.h"
#include "trainer/trainer.h"

namespace lt::test {

inline TokenBatch random_batch(Rng& rng, int64_t B, int64_t T) {
  std::vector<int32_t> ids(B * T), targets(B * T);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(rng.below(250));
    targets[i] = static_cast<int32_t>(rng.below(250));
  }
  return {Tensor::from_vector<int32_t>({B, T}, ids), Tensor::from_vector<int32_t>({B, T}, targets)};
}

inline TrainerSettings constant_lr(double lr) {
  TrainerSettings s;
  s.schedule.kind = "constant";
  s.schedule.peak = lr;
  return s;
}

inline std::vector<float> values_of(Trainer& trainer) { return trainer.parameters().values().to_vector<float>(); }

}  // namespace lt::test
