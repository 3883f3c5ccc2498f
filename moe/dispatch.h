// Dropless dispatch: every (token, slot) assignment is kept (no capacity factor,
// docs/architecture.md §3.8) and the assignments are sorted by expert with a stable counting sort
// (kernels::dispatch_plan), so each expert's tokens form one contiguous segment in token order. The
// plan stays on the routing's device, and its offsets come to the host once, right after the sort: the
// one wait for the device that dropless routing needs per MoE layer (the experts' sizes decide the
// GEMMs' shapes, which cuBLAS takes on the host). Every grouped GEMM of the layer, forward and backward,
// and the step's load statistics read that copy.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace lt {

struct DispatchPlan {
  Tensor token_of;     // [M = N*k] i32: the token of each sorted assignment
  Tensor position_of;  // [M] i32: where assignment token * k + slot sits in the sorted order
  Tensor offsets;      // [E + 1] i64: expert e owns sorted rows [offsets[e], offsets[e+1])
  Tensor host_offsets; // offsets' copy on the CPU (the same tensor when the routing is on the CPU)
};

DispatchPlan plan_dispatch(const Tensor& expert_ids_NK, int64_t num_experts);

}  // namespace lt
