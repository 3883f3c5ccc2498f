// Held-out evaluation: the mean next-token cross-entropy of a model over a whole token array.
#pragma once
#include <cstdint>

#include "model/ling.h"

namespace lt {

struct LossSum {
  double sum = 0;  // nats, summed over predicted tokens
  int64_t tokens = 0;
  double mean() const { return tokens ? sum / static_cast<double>(tokens) : 0; }
};

// Windows of T + 1 tokens start at 0, T, 2T, ..., so every token after the first is predicted exactly
// once; a final shorter window counts when it holds at least 2 tokens. Language-model loss only (no
// auxiliary losses), no gradients, `batch` windows per forward.
LossSum evaluate(LingForCausalLM& model, const Tensor& tokens, int64_t T, int64_t batch);

}  // namespace lt
