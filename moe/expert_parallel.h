// The routed experts split over the ranks of an expert-parallel group (the MoE side of --expert-parallel,
// issue 41): what a MoE layer asks of the exchange that carries its rows to their experts' ranks and back,
// and the experts' output computed through it. The exchange itself is dist/'s (dist/expert_exchange.h:
// ExpertExchange over a communicator); this layer sees only the interface, as it sees no communicator.
//
// An expert-parallel group of G ranks splits a MoE layer's E routed experts: rank g holds the L = E / G
// consecutive experts [g L, (g + 1) L). Each rank routes its own tokens and sorts its rows by expert (the
// dispatch); to_experts delivers every rank's rows for this rank's experts laid out expert by expert (each
// expert's rows in source-rank order, then in that rank's order), from_experts takes results back to
// where their rows came from. Both are exchanges and row permutations: no arithmetic, so the same bits
// whatever the timing, and each is the other's adjoint.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/variable.h"
#include "moe/dispatch.h"

namespace lt {

class TokenExchange {
 public:
  virtual ~TokenExchange() = default;
  virtual int64_t experts_per_rank() const = 0;
  // Local expert j's rows are [local_offsets()[j], local_offsets()[j + 1]) of to_experts' result.
  virtual const std::vector<int64_t>& local_offsets() const = 0;
  // This rank's rows [M, H] in expert order -> [R, H], every rank's rows for this rank's experts.
  virtual Tensor to_experts(const Tensor& rows_MH) const = 0;
  // [R, H] expert by expert -> [M, H] in this rank's order.
  virtual Tensor from_experts(const Tensor& rows_RH) const = 0;
};

// The group: an exchange for this step's rows, given this rank's rows per expert for all E experts.
// Collective over the group's ranks.
class ExpertGroup {
 public:
  virtual ~ExpertGroup() = default;
  virtual std::shared_ptr<const TokenExchange> exchange(const std::vector<int64_t>& counts_E) = 0;
};

// The exchange as autograd ops: each one's backward is the other's forward (the nodes keep the exchange,
// which must outlive the backward).
Variable exchange_to_experts(const Variable& rows_MH, std::shared_ptr<const TokenExchange> exchange);
Variable exchange_from_experts(const Variable& rows_RH, std::shared_ptr<const TokenExchange> exchange);

// moe_experts (moe/ops.h) with the experts split over `group`: x_NH and the routing weights w_NK of this
// rank's tokens with their plan over all E experts; this rank's experts' stacked weights, gate_up [L, 2I,
// H] and down [L, H, I]. The rows go to their experts' ranks, each rank multiplies its experts' segments
// of every rank's rows (moe_experts at one slot of weight 1 per row), the results come back and are
// combined with the routing weights. Collective over the group, forward and backward. Per token the
// arithmetic of moe_experts with all the experts; a local expert's weight gradient sums every rank's rows.
Variable expert_parallel_experts(const Variable& x_NH, const Variable& w_NK, const DispatchPlan& plan,
                                 const Variable& gate_up_L2IH, const Variable& down_LHI, ExpertGroup& group);

}  // namespace lt
