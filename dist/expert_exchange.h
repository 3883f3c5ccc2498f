// Expert parallelism's token exchange over a communicator (moe/expert_parallel.h has the interface the
// MoE layer sees, what it means and the experts' output computed through it): ExpertExchange moves one
// step's rows of a MoE layer, ExpertCommunicatorGroup makes one per step from an expert-parallel group.
//
// The exchange: every rank's row counts for each rank's experts cross in one all-to-all of E integers;
// then to_experts sends each rank's run of rows for rank g's experts to g (one all-to-all of rows, which
// delivers them source by source), and from_experts sends them home the same way back.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "moe/expert_parallel.h"

namespace lt {

class ExpertExchange : public TokenExchange {
 public:
  // counts_E: this rank's rows per expert, for all E experts (E a multiple of the group's size), its rows
  // sorted by expert. Collective over `group`.
  ExpertExchange(Communicator& group, const std::vector<int64_t>& counts_E);

  int64_t experts_per_rank() const override { return experts_per_rank_; }
  const std::vector<int64_t>& counts_from_ranks() const override { return counts_from_ranks_; }
  Tensor to_experts(const Tensor& rows_MH) const override;
  Tensor from_experts(const Tensor& rows_RH) const override;
  // The rows this rank sends (all of its rows) and receives (every rank's rows for its experts).
  int64_t rows_sent() const { return total(send_rows_); }
  int64_t rows_received() const { return total(recv_rows_); }

 private:
  static int64_t total(const std::vector<int64_t>& v);
  // An all-to-all of whole rows: send_rows[j] rows to rank j, recv_rows[j] from it.
  Tensor exchange(const Tensor& rows, const std::vector<int64_t>& send_rows,
                  const std::vector<int64_t>& recv_rows) const;

  Communicator& group_;
  int64_t experts_per_rank_ = 0;
  std::vector<int64_t> send_rows_, recv_rows_;  // per rank of the group
  std::vector<int64_t> counts_from_ranks_;      // [G L]
};

class ExpertCommunicatorGroup : public ExpertGroup {
 public:
  explicit ExpertCommunicatorGroup(Communicator& group) : group_(group) {}
  std::shared_ptr<const TokenExchange> exchange(const std::vector<int64_t>& counts_E) override {
    return std::make_shared<const ExpertExchange>(group_, counts_E);
  }

 private:
  Communicator& group_;
};

}  // namespace lt
