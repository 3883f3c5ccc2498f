#include "moe/expert_parallel.h"

#include <utility>

#include "autograd/ops.h"
#include "moe/ops.h"
#include "tensor/error.h"

namespace lt {
namespace {

struct ExchangeNode : Node {
  std::shared_ptr<const TokenExchange> exchange;
  bool to_experts = true;
  const char* name() const override { return to_experts ? "exchange_to_experts" : "exchange_from_experts"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {to_experts ? exchange->from_experts(g) : exchange->to_experts(g)};
  }
};

Variable exchanged(const Variable& rows, std::shared_ptr<const TokenExchange> exchange, bool to_experts) {
  Tensor out = to_experts ? exchange->to_experts(rows.value()) : exchange->from_experts(rows.value());
  auto node = std::make_shared<ExchangeNode>();
  node->exchange = std::move(exchange);
  node->to_experts = to_experts;
  return make_result(out, node, {rows});
}

}  // namespace

Variable exchange_to_experts(const Variable& rows_MH, std::shared_ptr<const TokenExchange> exchange) {
  return exchanged(rows_MH, std::move(exchange), true);
}

Variable exchange_from_experts(const Variable& rows_RH, std::shared_ptr<const TokenExchange> exchange) {
  return exchanged(rows_RH, std::move(exchange), false);
}

Variable expert_parallel_experts(const Variable& x_NH, const Variable& w_NK, const DispatchPlan& plan,
                                 const Variable& gate_up_L2IH, const Variable& down_LHI, ExpertGroup& group) {
  const int64_t N = x_NH.dim(0), H = x_NH.dim(1), k = w_NK.dim(1);
  const std::vector<int64_t> offsets = plan.host_offsets.to(Device::cpu()).to_vector<int64_t>();
  std::vector<int64_t> counts(offsets.size() - 1);
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = offsets[e + 1] - offsets[e];
  const std::shared_ptr<const TokenExchange> exchange = group.exchange(counts);
  const int64_t L = exchange->experts_per_rank();
  LT_CHECK(gate_up_L2IH.dim(0) == L && down_LHI.dim(0) == L, "expert parallel: this rank holds ",
           gate_up_L2IH.dim(0), " experts, the group's split gives it ", L);

  // This rank's rows in expert order, to their experts' ranks.
  const Variable at_experts = exchange_to_experts(gather_rows(x_NH, plan.token_of), exchange);
  // There each row is a token of its own with one slot of weight 1, already in local-expert order.
  const std::vector<int64_t>& local = exchange->local_offsets();
  const int64_t R = local.back();
  std::vector<int32_t> local_expert(static_cast<size_t>(R));
  for (size_t j = 0; j + 1 < local.size(); ++j)
    for (int64_t r = local[j]; r < local[j + 1]; ++r) local_expert[static_cast<size_t>(r)] = static_cast<int32_t>(j);
  const Device device = x_NH.value().device();
  const DispatchPlan local_plan = plan_dispatch(Tensor::from_vector<int32_t>({R, 1}, local_expert).to(device), L);
  const Variable ones(Tensor::full({R, 1}, 1.0, x_NH.value().dtype(), device));
  const Variable y_RH = moe_experts(at_experts, ones, local_plan, gate_up_L2IH, down_LHI);

  // Back in this rank's expert order; each token's k results weighed and summed: [N, 1, k] x [N, k, H].
  const Variable y_NkH = reshape(gather_rows(exchange_from_experts(y_RH, exchange), plan.position_of), {N, k, H});
  return reshape(matmul(reshape(w_NK, {N, 1, k}), y_NkH), {N, H});
}

}  // namespace lt
