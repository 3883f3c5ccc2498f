#include "moe/dispatch.h"

#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {

DispatchPlan plan_dispatch(const Tensor& expert_ids_NK, int64_t num_experts) {
  LT_PROFILE_SCOPE("plan_dispatch");
  LT_CHECK(num_experts >= 1, "plan_dispatch: ", num_experts, " experts");
  const Device device = expert_ids_NK.device();
  DispatchPlan plan;
  plan.token_of = Tensor::empty({expert_ids_NK.numel()}, DType::I32, device);
  plan.position_of = Tensor::empty({expert_ids_NK.numel()}, DType::I32, device);
  plan.offsets = Tensor::empty({num_experts + 1}, DType::I64, device);
  kernels::dispatch_plan(expert_ids_NK, plan.token_of, plan.position_of, plan.offsets);
  plan.host_offsets = plan.offsets.to(Device::cpu());
  return plan;
}

}  // namespace lt
