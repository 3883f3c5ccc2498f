#include "moe/expert_parallel.h"

#include <numeric>
#include <utility>
#include <vector>

#include "autograd/profile.h"
#include "autograd/saved.h"
#include "moe/ops.h"
#include "tensor/error.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

// One source rank's rows at this rank's experts: a block of to_experts' result, expert by expert, as the
// plan of the micro-batch that source is.
struct SourceBlock {
  int64_t begin = 0, rows = 0;  // within to_experts' result
  DispatchPlan plan;            // offsets over the L local experts, from 0 (the GEMMs read no other field)
  Tensor narrow(const Tensor& t) const { return t.narrow(begin, rows); }
};

std::vector<SourceBlock> source_blocks(const TokenExchange& exchange, Device device) {
  const std::vector<int64_t>& from = exchange.counts_from_ranks();
  const int64_t L = exchange.experts_per_rank(), G = static_cast<int64_t>(from.size()) / L;
  std::vector<SourceBlock> blocks;
  int64_t at = 0;
  for (int64_t s = 0; s < G; ++s) {
    std::vector<int64_t> offsets = {0};
    for (int64_t j = 0; j < L; ++j) offsets.push_back(offsets.back() + from[static_cast<size_t>(s * L + j)]);
    SourceBlock block;
    block.begin = at;
    block.rows = offsets.back();
    block.plan.host_offsets = Tensor::from_vector<int64_t>({L + 1}, offsets);
    block.plan.offsets = block.plan.host_offsets.to(device);
    at += block.rows;
    blocks.push_back(std::move(block));
  }
  return blocks;
}

// moe_experts' arithmetic (moe/ops.cpp) with an exchange on either side of the experts, each source's
// rows multiplied as their own group (moe/expert_parallel.h says why).
struct ExpertParallelNode : Node {
  std::shared_ptr<const TokenExchange> exchange;
  DispatchPlan plan;                // this rank's assignments over all E experts
  std::vector<SourceBlock> blocks;  // per rank of the group
  Tensor w_NK, gate_up_L2IH, down_LHI;
  SavedTensor saved_x_RH;         // the rows at the experts
  SavedTensor saved_gate_up_R2I;  // their SwiGLU pre-activations
  const char* name() const override { return "expert_parallel_experts"; }

  // The incoming gradient's rows and their assignments' weights go to the experts, whose dx rows and dw
  // come back.
  std::vector<Tensor> backward(const Tensor& g_NH) override {
    const int64_t N = w_NK.dim(0), k = w_NK.dim(1), M = N * k, H = g_NH.dim(1);
    Tensor g_MH = Tensor::empty({M, H}, g_NH.dtype(), g_NH.device());
    kernels::gather_rows(g_NH, plan.token_of, g_MH);
    const Tensor g_RH = exchange->to_experts(g_MH);
    // Each assignment's weight to its row in expert order: every row receives exactly one, so the sum
    // into zeros is the weight itself.
    Tensor w_M1 = Tensor::zeros({M, 1}, w_NK.dtype(), w_NK.device());
    kernels::scatter_add_rows(w_NK.reshape({M, 1}), plan.position_of, w_M1);
    const Tensor w_R1 = exchange->to_experts(w_M1);

    const Tensor& gate_up_R2I = saved_gate_up_R2I.stored();
    const int64_t R = gate_up_R2I.dim(0), I = gate_up_R2I.dim(1) / 2;
    const DType operand_dtype = gemm_operand_dtype(g_RH);
    Tensor dgate_up_R2I = Tensor::empty(gate_up_R2I.shape(), operand_dtype, g_NH.device());
    Tensor dw_R1 = Tensor::empty({R, 1}, w_NK.dtype(), w_NK.device());
    GradTarget ddown;
    {
      Tensor t_RI = Tensor::empty({R, I}, g_NH.dtype(), g_NH.device());
      Tensor wh_RI = Tensor::empty({R, I}, operand_dtype, g_NH.device());
      for (const SourceBlock& b : blocks) {
        Tensor t = b.narrow(t_RI);
        expert_matmuls(profile::Phase::Backward, {{b.narrow(g_RH), down_LHI, false, t, 0.0}}, b.plan);
      }
      // One slot per row, its assignment's weight: the identity as the positions.
      std::vector<int32_t> rows(static_cast<size_t>(R));
      std::iota(rows.begin(), rows.end(), 0);
      const Tensor identity = Tensor::from_vector<int32_t>({R}, rows).to(g_NH.device());
      kernels::swiglu_combine_backward(w_R1, identity, gate_up_R2I, t_RI, wh_RI, dgate_up_R2I, dw_R1);
      if (needs_grad(3)) {
        ddown = grad_target(3, down_LHI);
        for (size_t s = 0; s < blocks.size(); ++s)
          expert_weight_grads(
              {{blocks[s].narrow(g_RH), blocks[s].narrow(wh_RI), ddown.tensor, s == 0 ? ddown.beta : 1.0}},
              blocks[s].plan);
      }
    }
    GradTarget dgate_up;
    if (needs_grad(2)) {
      dgate_up = grad_target(2, gate_up_L2IH);
      const Tensor& x_RH = saved_x_RH.stored();
      for (size_t s = 0; s < blocks.size(); ++s)
        expert_weight_grads({{blocks[s].narrow(dgate_up_R2I), blocks[s].narrow(x_RH), dgate_up.tensor,
                              s == 0 ? dgate_up.beta : 1.0}},
                            blocks[s].plan);
    }
    Tensor dx, dw;
    if (needs_grad(0)) {
      Tensor dx_RH = Tensor::empty({R, H}, g_NH.dtype(), g_NH.device());
      for (const SourceBlock& b : blocks) {
        Tensor dx_block = b.narrow(dx_RH);
        expert_matmuls(profile::Phase::Backward, {{b.narrow(dgate_up_R2I), gate_up_L2IH, false, dx_block, 0.0}},
                       b.plan);
      }
      const Tensor dx_MH = exchange->from_experts(dx_RH);
      GradTarget dx_target = grad_target(0, g_NH);
      kernels::combine_rows(dx_MH, Tensor::full(w_NK.shape(), 1.0, w_NK.dtype(), w_NK.device()), plan.position_of,
                            dx_target.tensor, dx_target.beta);
      dx = dx_target.returned();
    }
    // The weights' gradients come home whether or not this rank's weights need them: the exchange is
    // collective.
    const Tensor dw_M1 = exchange->from_experts(dw_R1);
    if (needs_grad(1)) {
      dw = Tensor::empty({M, 1}, w_NK.dtype(), w_NK.device());
      kernels::gather_rows(dw_M1, plan.position_of, dw);
      dw = dw.reshape(w_NK.shape());
    }
    return {dx, dw, dgate_up.returned(), ddown.returned()};
  }
};

struct IdentityExchange : TokenExchange {
  std::vector<int64_t> counts;
  int64_t experts_per_rank() const override { return static_cast<int64_t>(counts.size()); }
  const std::vector<int64_t>& counts_from_ranks() const override { return counts; }
  Tensor to_experts(const Tensor& rows) const override { return rows.clone(); }
  Tensor from_experts(const Tensor& rows) const override { return rows.clone(); }
};

}  // namespace

std::shared_ptr<const TokenExchange> LocalExpertGroup::exchange(const std::vector<int64_t>& counts_E) {
  auto identity = std::make_shared<IdentityExchange>();
  identity->counts = counts_E;
  return identity;
}

Variable expert_parallel_experts(const Variable& x_NH, const Variable& w_NK, const DispatchPlan& plan,
                                 const Variable& gate_up_L2IH, const Variable& down_LHI, ExpertGroup& group) {
  LT_PROFILE_SCOPE("expert_parallel_experts");
  const Tensor& x = x_NH.value();
  const int64_t N = x.dim(0), H = x.dim(1), M = plan.token_of.numel();
  const std::vector<int64_t> offsets = plan.host_offsets.to(Device::cpu()).to_vector<int64_t>();
  std::vector<int64_t> counts(offsets.size() - 1);
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = offsets[e + 1] - offsets[e];
  std::shared_ptr<const TokenExchange> exchange = group.exchange(counts);
  const int64_t L = exchange->experts_per_rank();
  const Tensor &gate_up = gate_up_L2IH.value(), &down = down_LHI.value();
  LT_CHECK(gate_up.dim(0) == L && down.dim(0) == L, "expert parallel: this rank holds ", gate_up.dim(0),
           " experts, the group's split gives it ", L);
  LT_CHECK(w_NK.value().dim(0) == N && w_NK.value().numel() == M, "expert parallel: weights ", w_NK.value().str(),
           " and a plan of ", M, " assignments for ", N, " tokens");

  // This rank's rows in expert order, to their experts' ranks: under mixed precision x's kept bf16 copy, half
  // the bytes, which the experts' GEMMs take as it is and their node keeps.
  const SavedTensor saved_x = grad_enabled() ? SavedTensor::input(x_NH) : SavedTensor();
  const Tensor& x_rows = forward_operand(saved_x, x_NH);
  Tensor x_MH = Tensor::empty({M, H}, x_rows.dtype(), x.device());
  kernels::gather_rows(x_rows, plan.token_of, x_MH);
  const Tensor x_RH = exchange->to_experts(x_MH);
  std::vector<SourceBlock> blocks = source_blocks(*exchange, x.device());
  const int64_t R = x_RH.dim(0), I = gate_up.dim(1) / 2;

  // The experts' SwiGLU on each source's rows, as moe_experts computes it for a micro-batch.
  Tensor gate_up_R2I = Tensor::empty({R, 2 * I}, x.dtype(), x.device());
  for (const SourceBlock& b : blocks) {
    Tensor out = b.narrow(gate_up_R2I);
    expert_matmuls(profile::Phase::Forward, {{b.narrow(x_RH), gate_up, true, out, 0.0}}, b.plan);
  }
  const Tensor gate_up_kept = kept_copy_to_fill(gate_up_R2I);
  Tensor y_RH = Tensor::empty({R, H}, x.dtype(), x.device());
  {
    Tensor h_RI = Tensor::empty({R, I}, gemm_operand_dtype(gate_up_R2I), x.device());
    kernels::swiglu(gate_up_R2I, h_RI, gate_up_kept);
    for (const SourceBlock& b : blocks) {
      Tensor out = b.narrow(y_RH);
      expert_matmuls(profile::Phase::Forward, {{b.narrow(h_RI), down, true, out, 0.0}}, b.plan);
    }
  }
  // Back in this rank's expert order, combined with the routing weights as moe_experts combines them.
  const Tensor y_MH = exchange->from_experts(y_RH);
  Tensor out = Tensor::empty_like(x);
  kernels::combine_rows(y_MH, w_NK.value(), plan.position_of, out);

  auto node = std::make_shared<ExpertParallelNode>();
  if (grad_enabled()) {
    node->exchange = std::move(exchange);
    node->plan = plan;
    node->blocks = std::move(blocks);
    node->w_NK = w_NK.value();
    node->gate_up_L2IH = gate_up;
    node->down_LHI = down;
    // The received rows: x's kept copy's under mixed precision (bf16 already), else f32 kept as activations.
    node->saved_x_RH = x_RH.dtype() == DType::BF16 ? SavedTensor::kept_copy(x_RH) : SavedTensor::activation(x_RH);
    node->saved_gate_up_R2I = SavedTensor::activation(gate_up_R2I, gate_up_kept);
  }
  return make_result(out, node, {x_NH, w_NK, gate_up_L2IH, down_LHI});
}

}  // namespace lt
