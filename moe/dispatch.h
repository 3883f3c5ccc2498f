// Dropless dispatch: every (token, slot) assignment is kept (no capacity factor, spec/ling.md §10.4)
// and the assignments are sorted by expert with a stable counting sort, so each expert's tokens form
// one contiguous segment in token order. The sort is on the host: it touches N*k integers, written
// straight into the plan's tensors.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace lt {

struct DispatchPlan {
  Tensor token_of;                // [M = N*k] i32: the token of each sorted assignment
  Tensor position_of;             // [M] i32: where assignment token * k + slot sits in the sorted order
  std::vector<int64_t> offsets;   // [E + 1]: expert e owns sorted rows [offsets[e], offsets[e+1])
};

DispatchPlan plan_dispatch(const Tensor& expert_ids_NK, int64_t num_experts);

}  // namespace lt
