#include "dist/expert_exchange.h"

#include <numeric>
#include <utility>

#include "tensor/error.h"
#include "tensor/kernels.h"

namespace lt {

int64_t ExpertExchange::total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

ExpertExchange::ExpertExchange(Communicator& group, const std::vector<int64_t>& counts_E) : group_(group) {
  const int64_t G = group.size(), E = static_cast<int64_t>(counts_E.size());
  LT_CHECK(E > 0 && E % G == 0, "expert exchange: ", E, " experts do not split over ", G, " ranks");
  for (const int64_t c : counts_E) LT_CHECK(c >= 0, "expert exchange: a negative row count (", c, ")");
  const int64_t L = experts_per_rank_ = E / G;
  send_rows_.assign(static_cast<size_t>(G), 0);
  for (int64_t e = 0; e < E; ++e) send_rows_[static_cast<size_t>(e / L)] += counts_E[static_cast<size_t>(e)];
  // Every rank's counts for this rank's experts: from_s[s L + j], rows from rank s for local expert j.
  const Tensor mine = Tensor::from_vector<int64_t>({E}, counts_E);
  Tensor from = Tensor::empty({E}, DType::I64);
  group.all_to_all(mine, from);
  const std::vector<int64_t> from_s = from.to_vector<int64_t>();
  auto count = [&](int64_t s, int64_t j) { return from_s[static_cast<size_t>(s * L + j)]; };
  recv_rows_.assign(static_cast<size_t>(G), 0);
  local_offsets_.assign(static_cast<size_t>(L + 1), 0);
  for (int64_t s = 0; s < G; ++s)
    for (int64_t j = 0; j < L; ++j) {
      recv_rows_[static_cast<size_t>(s)] += count(s, j);
      local_offsets_[static_cast<size_t>(j + 1)] += count(s, j);
    }
  std::partial_sum(local_offsets_.begin(), local_offsets_.end(), local_offsets_.begin());
  // Where rank s's rows for local expert j start in what the all-to-all delivers (source by source).
  std::vector<int64_t> source_start(static_cast<size_t>(G * L));
  int64_t at = 0;
  for (int64_t s = 0; s < G; ++s)
    for (int64_t j = 0; j < L; ++j) {
      source_start[static_cast<size_t>(s * L + j)] = at;
      at += count(s, j);
    }
  const int64_t R = at;
  std::vector<int32_t> by_expert, by_source(static_cast<size_t>(R));
  by_expert.reserve(static_cast<size_t>(R));
  for (int64_t j = 0; j < L; ++j)
    for (int64_t s = 0; s < G; ++s)
      for (int64_t k = 0; k < count(s, j); ++k) {
        const int64_t row = source_start[static_cast<size_t>(s * L + j)] + k;
        by_source[static_cast<size_t>(row)] = static_cast<int32_t>(by_expert.size());
        by_expert.push_back(static_cast<int32_t>(row));
      }
  by_expert_ = Tensor::from_vector<int32_t>({R}, by_expert);
  by_source_ = Tensor::from_vector<int32_t>({R}, by_source);
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
  const Tensor by_source = exchange(rows_MH, send_rows_, recv_rows_);
  Tensor out = Tensor::empty(by_source.shape(), by_source.dtype(), by_source.device());
  if (out.numel() > 0) kernels::gather_rows(by_source, by_expert_.to(out.device()), out);
  return out;
}

Tensor ExpertExchange::from_experts(const Tensor& rows_RH) const {
  LT_CHECK(rows_RH.ndim() == 2 && rows_RH.dim(0) == rows_received(), "expert exchange: from_experts takes [",
           rows_received(), ", H] rows, got ", rows_RH.str());
  Tensor by_source = Tensor::empty(rows_RH.shape(), rows_RH.dtype(), rows_RH.device());
  if (by_source.numel() > 0) kernels::gather_rows(rows_RH, by_source_.to(rows_RH.device()), by_source);
  return exchange(by_source, recv_rows_, send_rows_);
}

}  // namespace lt
