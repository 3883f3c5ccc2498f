// The optimiser front door: one fused AdamW step over a flat parameter.
#include <initializer_list>

#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step,
                const std::vector<AdamWRun>& runs, const Tensor& param_bf16) {
  check_float(param, "adamw_step", "param");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&grad, &m, &v})
    check_same(*t, param, "adamw_step", "state");
  if (param_bf16.defined()) {
    LT_CHECK(param.dtype() == DType::F32 && param_bf16.dtype() == DType::BF16, "adamw_step: param_bf16 must be the bf16 ",
             "copy of an f32 param, got ", param_bf16.str(), " for ", param.str());
    check_device(param_bf16, param, "adamw_step", "param_bf16");
    check_shape(param_bf16, param.shape(), "adamw_step", "param_bf16");
  }
  LT_CHECK(step.t >= 1, "adamw_step: step count must start at 1");
  int64_t previous_end = 0;
  for (const AdamWRun& run : runs) {
    LT_CHECK(run.begin >= previous_end && run.begin < run.end && run.end <= param.numel(), "adamw_step: run [",
             run.begin, ", ", run.end, ") is empty, out of order or outside the ", param.numel(), " elements");
    previous_end = run.end;
  }
  if constexpr (kCudaBackend) {
    if (!param.is_cpu()) return cuda::adamw_step(param, grad, m, v, step, runs, param_bf16);
  }
  cpu::adamw_step(param, grad, m, v, step, runs, param_bf16);
}

}  // namespace lt::kernels
