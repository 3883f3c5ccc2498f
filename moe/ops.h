// The differentiable MoE ops, each with its backward beside its forward in moe/ops.cpp. (The router's
// ops are in moe/router.cpp.)
#pragma once
#include <vector>

#include "autograd/profile.h"
#include "autograd/variable.h"
#include "moe/dispatch.h"
#include "tensor/kernel_types.h"

namespace lt {

// The routed experts of a MoE block as one op (as MegaBlocks does): the tokens gathered into expert
// order, each expert's SwiGLU as grouped GEMMs over its contiguous segment of rows, and the weighted
// combine back to the tokens:
//   out[n, :] = sum_j w[n, j] * down[e] (silu(gate[e] x[n, :]) * up[e] x[n, :]),  e = the j-th expert of n,
// summed over j in order. x [N, H], w [N, k] (the gating weights), gate_up [E, 2I, H] (expert e's gate
// rows, then its up rows: nn/layers.h init_gate_up), down [E, H, I] (one expert's nn.Linear weight per
// slice), the plan from plan_dispatch of the same experts. Gate and up are one weight so that each
// direction multiplies them in one product: [M, 2I] pre-activations forward, one K = 2I product for dx.
//
// Memory: of the [M = N k, *] tensors only the gate and up pre-activations are kept for backward. The
// gathered inputs and the SwiGLU output are recomputed there, and the experts' outputs are never
// needed: the combine's backward is taken before the down projection (dw = dot(g W_down, h) per
// assignment), so the weighted copy, the outputs and the scatter of the unfused chain never exist.
Variable moe_experts(const Variable& x_NH, const Variable& w_NK, const DispatchPlan& plan,
                     const Variable& gate_up_E2IH, const Variable& down_EHI);

// The grouped GEMMs of routed experts (kernels::grouped_matmuls, grouped_weight_grads) over the plan's
// segments, counted by the profiler (the products under `phase`; they run in both directions). Each reads
// the segment bounds from the plan's host copy of the offsets: no wait for the device. moe_experts' and
// the expert-parallel experts' (moe/expert_parallel.h).
void expert_matmuls(profile::Phase phase, const std::vector<kernels::GroupedProduct>& products,
                    const DispatchPlan& plan);
void expert_weight_grads(const std::vector<kernels::GroupedWeightGrad>& grads, const DispatchPlan& plan);

}  // namespace lt
