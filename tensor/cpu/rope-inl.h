// The rotation of one head vector by RoPE (rotate-half convention, tensor/cpu/rope.cc), shared by the
// RoPE kernels and by attention, which rotates q and k as it gathers their blocks from a fused QKV
// projection (tensor/cpu/attention.cc). Both do the same arithmetic, so q and k have the same bits
// whichever rotated them. A Highway per-target header: it is included once per target from inside each
// file's foreach_target pass, hence the toggling guard rather than a plain one.
#if defined(LT_TENSOR_CPU_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LT_TENSOR_CPU_ROPE_INL_H_
#undef LT_TENSOR_CPU_ROPE_INL_H_
#else
#define LT_TENSOR_CPU_ROPE_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// y = x turned by the angles whose cos and sin are cos_t, sin_t [half] (by -angle when kInverse), for
// a head vector of 2 * half values: a = x[:half], b = x[half:],
//   y[i] = a[i] cos - b[i] sin,   y[i + half] = b[i] cos + a[i] sin.
// y may be x: each pair (a[i], b[i]) is loaded before either of its elements is stored.
template <bool kInverse, class T>
HWY_INLINE void RotateHalf(const T* x, T* y, const T* cos_t, const T* sin_t, int64_t half) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const T* xa = x;
  const T* xb = x + half;
  T* ya = y;
  T* yb = y + half;
  int64_t i = 0;
  for (; i + lanes <= half; i += lanes) {
    const auto a = hn::LoadU(d, xa + i), b = hn::LoadU(d, xb + i);
    const auto c = hn::LoadU(d, cos_t + i), s = hn::LoadU(d, sin_t + i);
    if constexpr (kInverse) {  // turn by -angle: (a cos + b sin, b cos - a sin)
      hn::StoreU(hn::MulAdd(b, s, hn::Mul(a, c)), d, ya + i);
      hn::StoreU(hn::NegMulAdd(a, s, hn::Mul(b, c)), d, yb + i);
    } else {
      hn::StoreU(hn::NegMulAdd(b, s, hn::Mul(a, c)), d, ya + i);
      hn::StoreU(hn::MulAdd(a, s, hn::Mul(b, c)), d, yb + i);
    }
  }
  for (; i < half; ++i) {
    const T a = xa[i], b = xb[i], c = cos_t[i], s = kInverse ? -sin_t[i] : sin_t[i];
    ya[i] = a * c - b * s;
    yb[i] = b * c + a * s;
  }
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LT_TENSOR_CPU_ROPE_INL_H_
