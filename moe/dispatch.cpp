#include "moe/dispatch.h"

namespace lt {

DispatchPlan plan_dispatch(const Tensor& expert_ids_NK, int64_t num_experts) {
  LT_CHECK(expert_ids_NK.ndim() == 2 && expert_ids_NK.dtype() == DType::I32, "plan_dispatch: expert ids must be i32 [N, k], got ",
           expert_ids_NK.str());
  const int64_t N = expert_ids_NK.dim(0), k = expert_ids_NK.dim(1), M = N * k;
  const std::vector<int32_t> ids = expert_ids_NK.to_vector<int32_t>();
  DispatchPlan plan;
  plan.offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int32_t e : ids) {
    LT_CHECK(e >= 0 && e < num_experts, "plan_dispatch: expert id ", e, " outside [0, ", num_experts, ")");
    ++plan.offsets[static_cast<size_t>(e) + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) plan.offsets[e + 1] += plan.offsets[e];
  std::vector<int32_t> order(static_cast<size_t>(M)), token(static_cast<size_t>(M));
  std::vector<int64_t> next(plan.offsets.begin(), plan.offsets.end() - 1);
  for (int64_t a = 0; a < M; ++a) {  // assignments in (token, slot) order: the sort is stable
    const int64_t pos = next[static_cast<size_t>(ids[a])]++;
    order[pos] = static_cast<int32_t>(a);
    token[pos] = static_cast<int32_t>(a / k);
  }
  const Device device = expert_ids_NK.device();
  plan.assignment_order = Tensor::from_vector<int32_t>({M}, order, device);
  plan.token_of = Tensor::from_vector<int32_t>({M}, token, device);
  return plan;
}

}  // namespace lt
