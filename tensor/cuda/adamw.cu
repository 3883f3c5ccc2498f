// The fused AdamW step on the GPU: one thread per element of the flat buffers in a grid-stride loop,
// the arithmetic of the CPU kernel's vector path (tensor/cpu/adamw.cc) with the same fused
// multiply-adds, the bias corrections folded into scalars the host computes once (AdamWStep).
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

template <class T>
struct AdamWScalars {
  T decay, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, inv_sqrt_bc2, eps, grad_scale;
};

template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamWScalars<T> s) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const T gi = g[i] * s.grad_scale;
    const T mi = fused_multiply_add(s.beta1, m[i], s.one_minus_beta1 * gi);
    const T vi = fused_multiply_add(s.beta2, v[i], s.one_minus_beta2 * (gi * gi));
    const T denom = fused_multiply_add(square_root(vi), s.inv_sqrt_bc2, s.eps);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * s.decay - (s.step_size * mi) / denom;
  }
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const kernels::AdamWStep& step) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const DeviceGuard guard(param.device().index);
  LT_FLOAT_SWITCH(param.dtype(), T, {
    const AdamWScalars<T> s{T(1.0 - step.lr * step.weight_decay),
                            T(step.beta1),
                            T(step.beta2),
                            T(1.0 - step.beta1),
                            T(1.0 - step.beta2),
                            T(step.step_size()),
                            T(step.inv_sqrt_bias_correction2()),
                            T(step.eps),
                            T(step.grad_scale)};
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, adamw_kernel<T>)(
        param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), n, s);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
