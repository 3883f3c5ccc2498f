// The fused AdamW update: one pass over parameter, gradient and both moments.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/adamw.cc"
#include <cmath>
#include <type_traits>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/bf16-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// p_bf16 (f32 only; nullptr: none): the bf16 of each new value, written in the same pass (the weights'
// copy that the next step's bf16 matmuls read, tensor/bf16_shadow.h).
template <class T>
void AdamWT(T* p, const T* g, T* m, T* v, int64_t n, const AdamWStep& s, uint16_t* p_bf16) {
  // Bias corrections folded into two scalars: p -= step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps).
  const T decay = T(1.0 - s.lr * s.weight_decay);
  const T b1 = T(s.beta1), b2 = T(s.beta2), one_minus_b1 = T(1.0 - s.beta1), one_minus_b2 = T(1.0 - s.beta2);
  const T step_size = T(s.step_size());
  const T inv_sqrt_bc2 = T(s.inv_sqrt_bias_correction2());
  const T eps = T(s.eps), grad_scale = T(s.grad_scale);
  parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto vdecay = hn::Set(d, decay), vb1 = hn::Set(d, b1), vb2 = hn::Set(d, b2);
    const auto v1mb1 = hn::Set(d, one_minus_b1), v1mb2 = hn::Set(d, one_minus_b2);
    const auto vstep = hn::Set(d, step_size), vbc2 = hn::Set(d, inv_sqrt_bc2), veps = hn::Set(d, eps);
    const auto vscale = hn::Set(d, grad_scale);
    int64_t i = begin;
    for (; i + lanes <= end; i += lanes) {
      const auto gi = hn::Mul(hn::LoadU(d, g + i), vscale);
      const auto mi = hn::MulAdd(vb1, hn::LoadU(d, m + i), hn::Mul(v1mb1, gi));
      const auto vi = hn::MulAdd(vb2, hn::LoadU(d, v + i), hn::Mul(v1mb2, hn::Mul(gi, gi)));
      const auto denom = hn::MulAdd(hn::Sqrt(vi), vbc2, veps);
      const auto pi = hn::Mul(hn::LoadU(d, p + i), vdecay);
      hn::StoreU(mi, d, m + i);
      hn::StoreU(vi, d, v + i);
      const auto updated = hn::Sub(pi, hn::Div(hn::Mul(vstep, mi), denom));
      hn::StoreU(updated, d, p + i);
      if constexpr (std::is_same_v<T, float>)
        if (p_bf16) StoreBf16(d, updated, p_bf16 + i);
    }
    for (; i < end; ++i) {
      const T gi = g[i] * grad_scale;
      m[i] = b1 * m[i] + one_minus_b1 * gi;
      v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
      p[i] = p[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
      if constexpr (std::is_same_v<T, float>)
        if (p_bf16) p_bf16[i] = f32_to_bf16(p[i]);
    }
  });
}

void AdamWKernel(DType dtype, void* p, const void* g, void* m, void* v, int64_t n, const AdamWStep& s,
                 uint16_t* p_bf16) {
  LT_FLOAT_SWITCH(dtype, T,
                  AdamWT<T>(static_cast<T*>(p), static_cast<const T*>(g), static_cast<T*>(m), static_cast<T*>(v), n, s,
                            p_bf16));
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(AdamWKernel);

// Run by run, each with its decay.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step,
                const std::vector<AdamWRun>& runs, const Tensor& param_bf16) {
  const auto at = [bytes = static_cast<int64_t>(dtype_size(param.dtype()))](const Tensor& t, int64_t i) {
    return static_cast<char*>(t.raw_data()) + i * bytes;
  };
  for (const AdamWRun& run : kernels::stepped_runs(runs, param.numel())) {
    AdamWStep run_step = step;
    if (!run.weight_decay) run_step.weight_decay = 0;
    HWY_DYNAMIC_DISPATCH(AdamWKernel)(param.dtype(), at(param, run.begin), at(grad, run.begin), at(m, run.begin),
                                      at(v, run.begin), run.end - run.begin, run_step,
                                      param_bf16.defined() ? param_bf16.bf16_data() + run.begin : nullptr);
  }
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
