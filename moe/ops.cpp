#include "moe/ops.h"

#include "autograd/profile.h"
#include "autograd/saved.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct MoEExpertsNode : Node {
  SavedTensor saved_x_NH;
  SavedTensor saved_gate_up_M2I;  // the SwiGLU's pre-activations, gate and up side by side
  Tensor w_NK, gate_up_E2IH, down_EHI;
  DispatchPlan plan;
  const char* name() const override { return "moe_experts"; }

  // The rows of x and of the incoming gradient in expert order (row m is token token_of[m]'s) are never
  // copied out: the grouped GEMMs read them through token_of. Under mixed precision the kernel writes the
  // operands that only the GEMMs read (dgate_up, the weighed h) in bf16 (gemm_operand_dtype), and the
  // GEMMs take x's kept bf16 copy as it is.
  std::vector<Tensor> backward(const Tensor& g_NH) override {
    // gate_up as kept: the kernel widens a bf16 copy as it reads it.
    const Tensor& gate_up_M2I = saved_gate_up_M2I.stored();
    const int64_t M = gate_up_M2I.dim(0), I = gate_up_M2I.dim(1) / 2;
    // The combine, taken before the down projection, and the SwiGLU in one pass: with g_M the incoming
    // gradient in expert order and t = g_M W_down (what reaches h at weight 1), dw = dot(t, h) per
    // assignment, dL/dh = w t (through the SwiGLU into dgate_up), and dW_down = g_M^T (w h).
    const DType operand_dtype = gemm_operand_dtype(g_NH);
    Tensor dgate_up_M2I = Tensor::empty(gate_up_M2I.shape(), operand_dtype, g_NH.device());
    Tensor dw = needs_grad(1) ? Tensor::empty_like(w_NK) : Tensor();
    GradTarget ddown;
    {
      Tensor t_MI = Tensor::empty({M, I}, g_NH.dtype(), g_NH.device());
      Tensor wh_MI = Tensor::empty({M, I}, operand_dtype, g_NH.device());
      expert_matmuls(profile::Phase::Backward, {{g_NH, down_EHI, false, t_MI, 0.0, plan.token_of}}, plan);
      kernels::swiglu_combine_backward(w_NK, plan.position_of, gate_up_M2I, t_MI, wh_MI, dgate_up_M2I, dw);
      if (needs_grad(3)) {
        ddown = grad_target(3, down_EHI);
        expert_weight_grads({{g_NH, wh_MI, ddown.tensor, ddown.beta, plan.token_of}}, plan);
      }
    }
    GradTarget dgate_up;
    if (needs_grad(2)) {
      dgate_up = grad_target(2, gate_up_E2IH);
      expert_weight_grads({{dgate_up_M2I, saved_x_NH.stored(), dgate_up.tensor, dgate_up.beta, {}, plan.token_of}},
                          plan);
    }
    Tensor dx;
    if (needs_grad(0)) {
      // dx_M = [dgate | dup] [W_gate; W_up] per expert: one product over K = 2I, then summed back to the
      // tokens.
      Tensor dx_MH = Tensor::empty({M, gate_up_E2IH.dim(2)}, g_NH.dtype(), g_NH.device());
      expert_matmuls(profile::Phase::Backward, {{dgate_up_M2I, gate_up_E2IH, false, dx_MH, 0.0}}, plan);
      // Each token's k rows summed in slot order, written once: the combine at unit weights (a
      // scatter-add would zero dx first and then read and write each token's row k times), added to x's
      // gradient where its other uses (the shared expert, the router) have begun it.
      GradTarget dx_target = grad_target(0, g_NH);
      kernels::combine_rows(dx_MH, Tensor::full(w_NK.shape(), 1.0, w_NK.dtype(), w_NK.device()), plan.position_of,
                            dx_target.tensor, dx_target.beta);
      dx = dx_target.returned();
    }
    return {dx, dw, dgate_up.returned(), ddown.returned()};
  }
};

}  // namespace

void expert_matmuls(profile::Phase phase, const std::vector<kernels::GroupedProduct>& products,
                    const DispatchPlan& plan) {
  LT_PROFILE_PHASE_SCOPE("grouped_matmul", phase);
  kernels::grouped_matmuls(products, plan.offsets, plan.host_offsets);
}

void expert_weight_grads(const std::vector<kernels::GroupedWeightGrad>& grads, const DispatchPlan& plan) {
  LT_PROFILE_PHASE_SCOPE("grouped_matmul", profile::Phase::Backward);
  kernels::grouped_weight_grads(grads, plan.offsets, plan.host_offsets);
}

Variable moe_experts(const Variable& x_NH, const Variable& w_NK, const DispatchPlan& plan,
                     const Variable& gate_up_E2IH, const Variable& down_EHI) {
  LT_PROFILE_SCOPE("moe_experts");
  const Tensor& x = x_NH.value();
  const Tensor& w = w_NK.value();
  const Tensor &gate_up = gate_up_E2IH.value(), &down = down_EHI.value();
  LT_CHECK(gate_up.ndim() == 3 && gate_up.dim(1) % 2 == 0, "moe_experts: experts gate_up ", gate_up.str(),
           " is not [E, 2I, H]");
  const int64_t E = gate_up.dim(0), I = gate_up.dim(1) / 2, H = gate_up.dim(2);
  const Shape down_shape{E, H, I};
  LT_CHECK(x.ndim() == 2 && x.dim(1) == H && down.shape() == down_shape, "moe_experts: x ", x.str(),
           " and experts gate_up ", gate_up.str(), ", down ", down.str(),
           " do not fit ([N, H], [E, 2I, H], [E, H, I])");
  LT_CHECK(w.ndim() == 2 && w.dim(0) == x.dim(0) && plan.token_of.numel() == w.numel(), "moe_experts: weights ",
           w.str(), " and a plan of ", plan.token_of.numel(), " assignments for ", x.dim(0), " tokens");
  LT_CHECK(plan.offsets.numel() == E + 1, "moe_experts: the plan covers ", plan.offsets.numel() - 1,
           " experts, the weights ", E);
  const int64_t M = w.numel();
  // x kept before the product, so that under mixed precision the rows the forward GEMM gathers are its bf16
  // copy, as the backward's are: half the bytes, and nothing to round while packing.
  const SavedTensor saved_x = grad_enabled() ? SavedTensor::input(x_NH) : SavedTensor();
  const Tensor& x_operand = forward_operand(saved_x, x_NH);
  Tensor gate_up_M2I = Tensor::empty({M, 2 * I}, x.dtype(), x.device());
  expert_matmuls(profile::Phase::Forward, {{x_operand, gate_up, true, gate_up_M2I, 0.0, plan.token_of}}, plan);
  Tensor out = Tensor::empty_like(x);
  // Under mixed precision the SwiGLU writes the bf16 copy of its input that the node keeps, and h, which
  // only the down projection's GEMM reads, in bf16.
  const Tensor gate_up_kept = kept_copy_to_fill(gate_up_M2I);
  {
    Tensor h_MI = Tensor::empty({M, I}, gemm_operand_dtype(gate_up_M2I), x.device());
    kernels::swiglu(gate_up_M2I, h_MI, gate_up_kept);
    Tensor y_MH = Tensor::empty({M, H}, x.dtype(), x.device());
    expert_matmuls(profile::Phase::Forward, {{h_MI, down, true, y_MH, 0.0}}, plan);
    kernels::combine_rows(y_MH, w, plan.position_of, out);
  }
  auto node = std::make_shared<MoEExpertsNode>();
  if (grad_enabled()) {
    node->saved_x_NH = saved_x;
    node->w_NK = w;
    node->gate_up_E2IH = gate_up;
    node->down_EHI = down;
    node->saved_gate_up_M2I = SavedTensor::activation(gate_up_M2I, gate_up_kept);
    node->plan = plan;
  }
  return make_result(out, node, {x_NH, w_NK, gate_up_E2IH, down_EHI});
}

}  // namespace lt
