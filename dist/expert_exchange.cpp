#include "dist/expert_exchange.h"

#include <numeric>
#include <utility>

#include "tensor/error.h"

namespace lt {

int64_t ExpertExchange::total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

ExpertExchange::ExpertExchange(Communicator& group, const std::vector<int64_t>& counts_E) : group_(group) {
  const int64_t G = group.size(), E = static_cast<int64_t>(counts_E.size());
  LT_CHECK(E > 0 && E % G == 0, "expert exchange: ", E, " experts do not split over ", G, " ranks");
  for (const int64_t c : counts_E) LT_CHECK(c >= 0, "expert exchange: a negative row count (", c, ")");
  const int64_t L = experts_per_rank_ = E / G;
  send_rows_.assign(static_cast<size_t>(G), 0);
  for (int64_t e = 0; e < E; ++e) send_rows_[static_cast<size_t>(e / L)] += counts_E[static_cast<size_t>(e)];
  // Every rank's counts for this rank's experts: [s L + j], rows from rank s for local expert j.
  const Tensor mine = Tensor::from_vector<int64_t>({E}, counts_E);
  Tensor from = Tensor::empty({E}, DType::I64);
  group.all_to_all(mine, from);
  counts_from_ranks_ = from.to_vector<int64_t>();
  recv_rows_.assign(static_cast<size_t>(G), 0);
  for (int64_t s = 0; s < G; ++s)
    for (int64_t j = 0; j < L; ++j)
      recv_rows_[static_cast<size_t>(s)] += counts_from_ranks_[static_cast<size_t>(s * L + j)];
}

Tensor ExpertExchange::exchange(const Tensor& rows, const std::vector<int64_t>& send_rows,
                                const std::vector<int64_t>& recv_rows) const {
  const int64_t H = rows.dim(1);
  std::vector<int64_t> send(send_rows), recv(recv_rows);
  for (int64_t& n : send) n *= H;
  for (int64_t& n : recv) n *= H;
  Tensor out = Tensor::empty({total(recv_rows), H}, rows.dtype(), rows.device());
  group_.all_to_all(rows, send, out, recv);
  return out;
}

Tensor ExpertExchange::to_experts(const Tensor& rows_MH) const {
  LT_CHECK(rows_MH.ndim() == 2 && rows_MH.dim(0) == rows_sent(), "expert exchange: to_experts takes [", rows_sent(),
           ", H] rows, got ", rows_MH.str());
  return exchange(rows_MH, send_rows_, recv_rows_);
}

Tensor ExpertExchange::from_experts(const Tensor& rows_RH) const {
  LT_CHECK(rows_RH.ndim() == 2 && rows_RH.dim(0) == rows_received(), "expert exchange: from_experts takes [",
           rows_received(), ", H] rows, got ", rows_RH.str());
  return exchange(rows_RH, recv_rows_, send_rows_);
}

}  // namespace lt
