// The routed experts split over the ranks of an expert-parallel group (the MoE side of --expert-parallel,
// issue 41): what a MoE layer asks of the exchange that carries its rows to their experts' ranks and back,
// and the experts' output computed through it. The exchange itself is dist/'s (dist/expert_exchange.h:
// ExpertExchange over a communicator); this layer sees only the interface, as it sees no communicator.
//
// An expert-parallel group of G ranks splits a MoE layer's E routed experts: rank g holds the L = E / G
// consecutive experts [g L, (g + 1) L). Each rank routes its own tokens and sorts its rows by expert (the
// dispatch); to_experts delivers every rank's rows for this rank's experts source by source (rank 0's rows
// for them, in its expert order, then rank 1's, ...), from_experts takes results back to where their rows
// came from. Both are exchanges: no arithmetic, so the same bits whatever the timing, and each is the
// other's adjoint.
//
// The experts multiply each source rank's rows as a group of its own, the products one process makes for
// a micro-batch: a GEMM's result for a row may depend on the other rows of its segment (the kernel's
// tiling), so rows from several ranks in one segment would not have the bits of one process with --accum.
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
  // Rows from rank s for local expert j at [s L + j] (G L counts): the layout of to_experts' result.
  virtual const std::vector<int64_t>& counts_from_ranks() const = 0;
  // This rank's rows [M, H] in expert order -> [R, H], every rank's rows for this rank's experts, source by
  // source. Any dtype and width.
  virtual Tensor to_experts(const Tensor& rows_MH) const = 0;
  // [R, H] source by source -> [M, H] in this rank's order.
  virtual Tensor from_experts(const Tensor& rows_RH) const = 0;
};

// The group: an exchange for this step's rows, given this rank's rows per expert for all E experts.
// Collective over the group's ranks.
class ExpertGroup {
 public:
  virtual ~ExpertGroup() = default;
  virtual std::shared_ptr<const TokenExchange> exchange(const std::vector<int64_t>& counts_E) = 0;
};

// A group of one rank: every expert is local and the rows arrive as they were sent, so its exchange is the
// identity (what dist's ExpertExchange is on one rank): expert_parallel_experts' own arithmetic without a
// communicator, for its gradient check and its check on a GPU.
class LocalExpertGroup : public ExpertGroup {
 public:
  std::shared_ptr<const TokenExchange> exchange(const std::vector<int64_t>& counts_E) override;
};

// moe_experts (moe/ops.h) with the experts split over `group`: x_NH and the routing weights w_NK of this
// rank's tokens with their plan over all E experts; this rank's experts' stacked weights, gate_up [L, 2I,
// H] and down [L, H, I]. The rows go to their experts' ranks, each rank multiplies its experts' segments
// of every rank's rows, the results come back and are combined with the routing weights; the backward
// sends the incoming gradient's rows and their weights the same way and brings dx and dw home. Collective
// over the group, forward and backward. Every result has the bits one process holding all E experts gives
// with rank s's tokens as its micro-batch s (--accum G): the output, dx and dw of each rank's tokens, and a
// local expert's weight gradients, accumulated over the source ranks in rank order.
Variable expert_parallel_experts(const Variable& x_NH, const Variable& w_NK, const DispatchPlan& plan,
                                 const Variable& gate_up_L2IH, const Variable& down_LHI, ExpertGroup& group);

}  // namespace lt
