// Expert parallelism's token exchange (the first piece of --expert-parallel, issue 41): the rows a rank
// routed to experts go to the ranks that hold those experts, and the experts' results come back.
//
// An expert-parallel group of G ranks splits a MoE layer's E routed experts: rank g holds the L = E / G
// consecutive experts [g L, (g + 1) L). Each rank routes its own tokens and sorts its rows by expert
// (the dispatch), so the rows for rank g's experts are one contiguous run of its rows. to_experts sends
// each run to its rank (one all-to-all) and lays what arrives out expert by expert, each expert's rows
// in source-rank order and, within a source, in that rank's order: rank g then multiplies its experts'
// segments as one process multiplies its own (local_offsets() are the segments). from_experts is the way
// back. Both are exchanges and row permutations: no arithmetic, so the same bits whatever the timing, and
// each is the other's adjoint, which is how autograd runs them backward (exchange_to_experts's gradient
// goes back through from_experts, and the reverse).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/variable.h"
#include "dist/communicator.h"

namespace lt {

class ExpertExchange {
 public:
  // counts_E: this rank's rows per expert, for all E experts (E a multiple of the group's size), its rows
  // sorted by expert. Collective over `group`: every rank's counts for this rank's experts arrive here.
  ExpertExchange(Communicator& group, const std::vector<int64_t>& counts_E);

  int64_t experts_per_rank() const { return experts_per_rank_; }
  int64_t first_expert() const { return static_cast<int64_t>(group_.rank()) * experts_per_rank_; }
  // The rows this rank sends (all of its rows) and receives (every rank's rows for its experts).
  int64_t rows_sent() const { return total(send_rows_); }
  int64_t rows_received() const { return total(recv_rows_); }
  // Local expert j's rows are [local_offsets()[j], local_offsets()[j + 1]) of to_experts' result.
  const std::vector<int64_t>& local_offsets() const { return local_offsets_; }

  // rows_MH [rows_sent(), H] in this rank's expert order -> [rows_received(), H], expert by expert.
  Tensor to_experts(const Tensor& rows_MH) const;
  // The reverse: [rows_received(), H] expert by expert -> [rows_sent(), H] in this rank's order.
  Tensor from_experts(const Tensor& rows_RH) const;

 private:
  static int64_t total(const std::vector<int64_t>& v);
  // An all-to-all of rows of `columns` elements: send_rows[j] rows to rank j, recv_rows[j] from it.
  Tensor exchange(const Tensor& rows, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) const;

  Communicator& group_;
  int64_t experts_per_rank_ = 0;
  std::vector<int64_t> send_rows_, recv_rows_;  // per rank of the group
  std::vector<int64_t> local_offsets_;          // [L + 1]
  // Row r of the expert-by-expert layout is row by_expert_[r] of the source-by-source one that the
  // all-to-all delivers (i32 [rows_received()]), and row r of the latter is row by_source_[r] of the former.
  Tensor by_expert_, by_source_;
};

// The exchange as autograd ops: each one's backward is the other's forward (the nodes keep the exchange,
// whose group must outlive the backward).
Variable exchange_to_experts(const Variable& rows_MH, std::shared_ptr<const ExpertExchange> exchange);
Variable exchange_from_experts(const Variable& rows_RH, std::shared_ptr<const ExpertExchange> exchange);

}  // namespace lt
