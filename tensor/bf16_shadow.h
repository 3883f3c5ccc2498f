// The bf16 rounding of an f32 tensor kept beside it while a scope lives, so that mixed-precision matmuls
// on a GPU (--dtype bf16) read a weight's bf16 operand from it instead of rounding the weight again for
// every product. A training step rounds the flat parameter values once, at its start, and registers the
// copy for its forward and backward (Trainer::step); under parameter sharding each layer is rounded as it
// is gathered and registered until it is released (dist/parameter_shards.h), so copies come and go in any
// order. The optimiser changes the values only after the scopes have ended, so a registered copy is never
// stale.
#pragma once
#include "tensor/tensor.h"

namespace lt {

class Bf16Shadow {
 public:
  // values: a contiguous f32 tensor; values_bf16: bf16 of the same shape, its rounding (the caller's).
  Bf16Shadow(const Tensor& values, const Tensor& values_bf16);
  ~Bf16Shadow();
  Bf16Shadow(const Bf16Shadow&) = delete;
  Bf16Shadow& operator=(const Bf16Shadow&) = delete;
};

// The bf16 copy of `t` (f32 elements inside a registered tensor), shaped like t; undefined when t has
// no registered copy.
Tensor bf16_shadow_of(const Tensor& t);

}  // namespace lt
