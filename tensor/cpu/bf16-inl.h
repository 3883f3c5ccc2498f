// bf16 <-> f32 on Highway vectors, with the scalar conversions' bits (tensor/dtype.h): rounding to nearest
// even with a NaN kept NaN, and widening exactly. (Highway's own demotion to bf16 truncates.) A Highway
// per-target header, included once per target from inside each file's foreach_target pass, hence the
// toggling guard rather than a plain one.
#if defined(LT_TENSOR_CPU_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LT_TENSOR_CPU_BF16_INL_H_
#undef LT_TENSOR_CPU_BF16_INL_H_
#else
#define LT_TENSOR_CPU_BF16_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "tensor/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[0 : Lanes(df)] = the bf16 of x's lanes (f32_to_bf16).
template <class DF>
HWY_INLINE void StoreBf16(DF, hn::Vec<DF> x, uint16_t* HWY_RESTRICT out) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const auto bits = hn::BitCast(du, x);
  const auto is_nan = hn::Gt(hn::And(bits, hn::Set(du, 0x7FFFFFFFu)), hn::Set(du, 0x7F800000u));
  const auto bias = hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u)));
  const auto rounded = hn::ShiftRight<16>(hn::Add(bits, bias));
  const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x0040u));
  // Every lane is below 2^16 now, so the saturating demotion from i32 keeps it as it is.
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::IfThenElse(is_nan, quiet, rounded))), d16, out);
}

// dst[0 : n] = the bf16 of src[0 : n] (f32_to_bf16): a row rounded while it is in cache.
HWY_INLINE void RoundRowToBf16(const float* HWY_RESTRICT src, int64_t n, uint16_t* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) StoreBf16(d, hn::LoadU(d, src + i), dst + i);
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

// The Lanes(df) bf16 values at in, widened to f32 (bf16_to_f32).
template <class DF>
HWY_INLINE hn::Vec<DF> LoadBf16(DF df, const uint16_t* HWY_RESTRICT in) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, in))));
}

// dst[0 : n] = src[0 : n] widened (bf16_to_f32): a kept copy's row, for a kernel that computes in f32.
HWY_INLINE void WidenRowFromBf16(const uint16_t* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(LoadBf16(d, src + i), d, dst + i);
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// Lanes(d) values at p: f32 or f64 as they are, bf16 (uint16_t, with d an f32 tag) widened; and one.
template <class D, class E>
HWY_INLINE hn::Vec<D> LoadWidened(D d, const E* HWY_RESTRICT p) {
  if constexpr (std::is_same_v<E, uint16_t>) return LoadBf16(d, p);
  else return hn::LoadU(d, p);
}
template <class T, class E>
HWY_INLINE T Widened(E x) {
  if constexpr (std::is_same_v<E, uint16_t>) return static_cast<T>(bf16_to_f32(x));
  else return x;
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LT_TENSOR_CPU_BF16_INL_H_
