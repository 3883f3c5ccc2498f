// The optimiser front door: one fused AdamW step over a flat parameter.
#include <initializer_list>

#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step) {
  check_float(param, "adamw_step", "param");
  for (const Tensor* t : std::initializer_list<const Tensor*>{&grad, &m, &v})
    check_same(*t, param, "adamw_step", "state");
  LT_CHECK(step.t >= 1, "adamw_step: step count must start at 1");
  if constexpr (kCudaBackend) {
    if (!param.is_cpu()) return cuda::adamw_step(param, grad, m, v, step);
  }
  cpu::adamw_step(param, grad, m, v, step);
}

}  // namespace lt::kernels
