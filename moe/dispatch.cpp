#include "moe/dispatch.h"

#include "autograd/profile.h"

namespace lt {

DispatchPlan plan_dispatch(const Tensor& expert_ids_NK, int64_t num_experts) {
  LT_PROFILE_SCOPE("plan_dispatch");
  LT_CHECK(expert_ids_NK.ndim() == 2 && expert_ids_NK.dtype() == DType::I32 && expert_ids_NK.is_cpu(),
           "plan_dispatch: expert ids must be i32 [N, k] on the CPU, got ", expert_ids_NK.str());
  const int64_t N = expert_ids_NK.dim(0), k = expert_ids_NK.dim(1), M = N * k;
  const int32_t* ids = expert_ids_NK.data<int32_t>();
  DispatchPlan plan;
  plan.offsets.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t a = 0; a < M; ++a) {
    LT_CHECK(ids[a] >= 0 && ids[a] < num_experts, "plan_dispatch: expert id ", ids[a], " outside [0, ", num_experts,
             ")");
    ++plan.offsets[static_cast<size_t>(ids[a]) + 1];
  }
  for (int64_t e = 0; e < num_experts; ++e) plan.offsets[e + 1] += plan.offsets[e];
  plan.token_of = Tensor::empty({M}, DType::I32);
  plan.position_of = Tensor::empty({M}, DType::I32);
  int32_t* token = plan.token_of.data<int32_t>();
  int32_t* position = plan.position_of.data<int32_t>();
  std::vector<int64_t> next(plan.offsets.begin(), plan.offsets.end() - 1);
  for (int64_t a = 0; a < M; ++a) {  // assignments in (token, slot) order: the sort is stable
    const int64_t pos = next[static_cast<size_t>(ids[a])]++;
    position[a] = static_cast<int32_t>(pos);
    token[pos] = static_cast<int32_t>(a / k);
  }
  return plan;
}

}  // namespace lt
