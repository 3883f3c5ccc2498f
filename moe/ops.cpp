#include "moe/ops.h"

#include "autograd/profile.h"
#include "autograd/saved.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

// The grouped GEMMs of the routed experts (kernels::grouped_matmuls, grouped_weight_grads) over the
// plan's segments, counted by the profiler under `phase` (they run in both directions). The gate and up
// projections go together, expert by expert, so that the operand they share stays in cache. Each
// reads the segment bounds from the plan's host copy of the offsets: no wait for the device.
void expert_matmuls(profile::Phase phase, const std::vector<kernels::GroupedProduct>& products,
                    const DispatchPlan& plan) {
  LT_PROFILE_PHASE_SCOPE("grouped_matmul", phase);
  kernels::grouped_matmuls(products, plan.offsets, plan.host_offsets);
}

// Expert weight gradients, each into its target (the stacked weight's gradient buffer when it has one).
void expert_weight_grads(const std::vector<kernels::GroupedWeightGrad>& grads, const DispatchPlan& plan) {
  LT_PROFILE_PHASE_SCOPE("grouped_matmul", profile::Phase::Backward);
  kernels::grouped_weight_grads(grads, plan.offsets, plan.host_offsets);
}

struct MoEExpertsNode : Node {
  SavedTensor saved_x_NH;
  SavedTensor saved_gate_MI, saved_up_MI;  // the SwiGLU's pre-activations
  Tensor w_NK, gate_EIH, up_EIH, down_EHI;
  DispatchPlan plan;
  const char* name() const override { return "moe_experts"; }

  // The rows of x and of the incoming gradient in expert order (row m is token token_of[m]'s) are never
  // copied out: the grouped GEMMs read them through token_of. Under mixed precision the kernel writes the
  // operands that only the GEMMs read (dgate, dup, the weighed h) in bf16 (gemm_operand_dtype), and the
  // GEMMs take x's kept bf16 copy as it is.
  std::vector<Tensor> backward(const Tensor& g_NH) override {
    // Gate and up as kept: the kernel widens bf16 copies as it reads them.
    const Tensor &gate_MI = saved_gate_MI.stored(), &up_MI = saved_up_MI.stored();
    const int64_t M = gate_MI.dim(0);
    // The combine, taken before the down projection, and the SwiGLU in one pass: with g_M the incoming
    // gradient in expert order and t = g_M W_down (what reaches h at weight 1), dw = dot(t, h) per
    // assignment, dL/dh = w t (through the SwiGLU into dgate, written over t where it stays f32, and
    // dup), and dW_down = g_M^T (w h).
    Tensor t_MI = Tensor::empty(gate_MI.shape(), g_NH.dtype(), g_NH.device());
    const DType operand_dtype = gemm_operand_dtype(t_MI);
    const bool operands_rounded = operand_dtype != t_MI.dtype();
    Tensor dgate_MI = operands_rounded ? Tensor::empty(t_MI.shape(), operand_dtype, t_MI.device()) : t_MI;
    Tensor dup_MI = Tensor::empty(t_MI.shape(), operand_dtype, t_MI.device());
    Tensor dw = needs_grad(1) ? Tensor::empty_like(w_NK) : Tensor();
    GradTarget ddown;
    {
      Tensor wh_MI = Tensor::empty(t_MI.shape(), operand_dtype, t_MI.device());
      expert_matmuls(profile::Phase::Backward, {{g_NH, down_EHI, false, t_MI, 0.0, plan.token_of}}, plan);
      kernels::swiglu_combine_backward(w_NK, plan.position_of, gate_MI, up_MI, t_MI, wh_MI, dup_MI, dw,
                                       operands_rounded ? dgate_MI : Tensor());
      if (needs_grad(4)) {
        ddown = grad_target(4, down_EHI);
        expert_weight_grads({{g_NH, wh_MI, ddown.tensor, ddown.beta, plan.token_of}}, plan);
      }
    }
    GradTarget dgate, dup;
    if (needs_grad(2) || needs_grad(3)) {
      const Tensor& x_NH = saved_x_NH.stored();
      std::vector<kernels::GroupedWeightGrad> grads;
      if (needs_grad(2)) {
        dgate = grad_target(2, gate_EIH);
        grads.push_back({dgate_MI, x_NH, dgate.tensor, dgate.beta, {}, plan.token_of});
      }
      if (needs_grad(3)) {
        dup = grad_target(3, up_EIH);
        grads.push_back({dup_MI, x_NH, dup.tensor, dup.beta, {}, plan.token_of});
      }
      expert_weight_grads(grads, plan);
    }
    Tensor dx;
    if (needs_grad(0)) {
      // dx_M = dgate W_gate + dup W_up per expert, then summed back to the tokens.
      Tensor dx_MH = Tensor::empty({M, gate_EIH.dim(2)}, g_NH.dtype(), g_NH.device());
      expert_matmuls(profile::Phase::Backward,
                     {{dgate_MI, gate_EIH, false, dx_MH, 0.0}, {dup_MI, up_EIH, false, dx_MH, 1.0}}, plan);
      // Each token's k rows summed in slot order, written once: the combine at unit weights (a
      // scatter-add would zero dx first and then read and write each token's row k times), added to x's
      // gradient where its other uses (the shared expert, the router) have begun it.
      GradTarget dx_target = grad_target(0, g_NH);
      kernels::combine_rows(dx_MH, Tensor::full(w_NK.shape(), 1.0, w_NK.dtype(), w_NK.device()), plan.position_of,
                            dx_target.tensor, dx_target.beta);
      dx = dx_target.returned();
    }
    return {dx, dw, dgate.returned(), dup.returned(), ddown.returned()};
  }
};

}  // namespace

Variable moe_experts(const Variable& x_NH, const Variable& w_NK, const DispatchPlan& plan, const Variable& gate_EIH,
                     const Variable& up_EIH, const Variable& down_EHI) {
  LT_PROFILE_SCOPE("moe_experts");
  const Tensor& x = x_NH.value();
  const Tensor& w = w_NK.value();
  const Tensor &gate = gate_EIH.value(), &up = up_EIH.value(), &down = down_EHI.value();
  const int64_t E = gate.dim(0), I = gate.dim(1), H = gate.dim(2);
  const Shape down_shape{E, H, I};
  LT_CHECK(x.ndim() == 2 && x.dim(1) == H && gate.ndim() == 3 && up.shape() == gate.shape() &&
               down.shape() == down_shape,
           "moe_experts: x ", x.str(), " and experts gate ", gate.str(), ", up ", up.str(), ", down ", down.str(),
           " do not fit ([N, H], [E, I, H], [E, I, H], [E, H, I])");
  LT_CHECK(w.ndim() == 2 && w.dim(0) == x.dim(0) && plan.token_of.numel() == w.numel(), "moe_experts: weights ",
           w.str(), " and a plan of ", plan.token_of.numel(), " assignments for ", x.dim(0), " tokens");
  LT_CHECK(plan.offsets.numel() == E + 1, "moe_experts: the plan covers ", plan.offsets.numel() - 1,
           " experts, the weights ", E);
  const int64_t M = w.numel();
  Tensor gate_MI = Tensor::empty({M, I}, x.dtype(), x.device()), up_MI = Tensor::empty_like(gate_MI);
  expert_matmuls(profile::Phase::Forward,
                 {{x, gate, true, gate_MI, 0.0, plan.token_of}, {x, up, true, up_MI, 0.0, plan.token_of}}, plan);
  Tensor out = Tensor::empty_like(x);
  // Under mixed precision the SwiGLU writes the bf16 copies of its inputs that the node keeps, and h, which
  // only the down projection's GEMM reads, in bf16.
  const Tensor gate_kept = kept_copy_to_fill(gate_MI), up_kept = kept_copy_to_fill(up_MI);
  {
    Tensor h_MI = Tensor::empty(gate_MI.shape(), gemm_operand_dtype(gate_MI), gate_MI.device());
    kernels::swiglu(gate_MI, up_MI, h_MI, gate_kept, up_kept);
    Tensor y_MH = Tensor::empty({M, H}, x.dtype(), x.device());
    expert_matmuls(profile::Phase::Forward, {{h_MI, down, true, y_MH, 0.0}}, plan);
    kernels::combine_rows(y_MH, w, plan.position_of, out);
  }
  auto node = std::make_shared<MoEExpertsNode>();
  if (grad_enabled()) {
    node->saved_x_NH = SavedTensor::input(x_NH);
    node->w_NK = w;
    node->gate_EIH = gate;
    node->up_EIH = up;
    node->down_EHI = down;
    node->saved_gate_MI = SavedTensor::activation(gate_MI, gate_kept);
    node->saved_up_MI = SavedTensor::activation(up_MI, up_kept);
    node->plan = plan;
  }
  return make_result(out, node, {x_NH, w_NK, gate_EIH, up_EIH, down_EHI});
}

}  // namespace lt
