// exp of arguments that are never positive: a softmax's x - max or x - logsumexp, attention's scores
// minus their row maximum, a sigmoid's -|x|. A Highway per-target header, included once per target from
// inside each file's foreach_target pass, hence the toggling guard rather than a plain one.
//
// hn::Exp handles the whole float range: its result is 2^n (1 + p(r)) with n = round(x / ln 2) taken
// through an integer conversion and back, and 2^n built as the product of two powers of two so that n
// may reach -149 (subnormal results) and +128. For x <= 0 only the bottom of that range matters, and
// below ln(2^-126) = -87.3 the result is under the smallest normal float, which a probability never
// needs. So here n comes from adding 1.5 x 2^23 + 127 (the sum's low mantissa bits then hold n + 127,
// the biased exponent of 2^n, and subtracting it back gives n exactly), 2^n is that sum shifted into
// the exponent field, and 2^n (1 + p) is one FMA. The reduction (ln 2 in two parts) and the polynomial
// p (degree 7, Highway's coefficients) are hn::Exp's, and so are the results: over every float in
// [-87.33, 0] (1.1e9 of them, on AVX3_DL and AVX2) all but 9 have hn::Exp's bits, and those 9, where n
// rounds the other way at a tie, are 1 ulp apart; both stay within 8.7e-8 of exp in double. It takes 16
// instructions per vector to hn::Exp's ~26: attention ran 4-6% faster on Zen 4. Below -87.33 the result
// is 0 (hn::Exp gives subnormals down to -104), and so it is for a NaN argument, as from hn::Exp (a row
// of -inf minus its max of -inf). Only for x <= 88: above, 2^n would overflow the exponent field.
#if defined(LT_TENSOR_CPU_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LT_TENSOR_CPU_EXP_INL_H_
#undef LT_TENSOR_CPU_EXP_INL_H_
#else
#define LT_TENSOR_CPU_EXP_INL_H_
#endif

#include <type_traits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpNonPositive(D d, V x) {
  if constexpr (!std::is_same_v<hn::TFromD<D>, float>) {
    return hn::Exp(d, x);  // f64 (the gradient checks): the full-range function
  } else {
    const hn::RebindToSigned<D> di;
    const V kBiasedRound = hn::Set(d, 12582912.0f + 127.0f);  // 1.5 x 2^23 + 127
    const V kSmallestNormalLog = hn::Set(d, -87.33654475f);   // ln(2^-126)
    const V biased = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), kBiasedRound);
    const V n = hn::Sub(biased, kBiasedRound);
    V r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), x);  // x - n ln 2, ln 2 in two parts
    r = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r);
    // exp(r) - 1 = r + r^2 (k0 + k1 r + ... + k5 r^5), the polynomial in Estrin's order.
    const V r2 = hn::Mul(r, r), r4 = hn::Mul(r2, r2);
    const V low = hn::MulAdd(hn::Set(d, 0.166666671633720397949219f), r, hn::Set(d, 0.5f));
    const V mid = hn::MulAdd(hn::Set(d, 0.00833336077630519866943359f), r, hn::Set(d, 0.0416664853692054748535156f));
    const V high = hn::MulAdd(hn::Set(d, 0.000198527617612853646278381f), r, hn::Set(d, 0.00139304355252534151077271f));
    const V expm1_r = hn::MulAdd(hn::MulAdd(high, r4, hn::MulAdd(mid, r2, low)), r2, r);
    const V two_to_n = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, biased)));
    return hn::IfThenElseZero(hn::Ge(x, kSmallestNormalLog), hn::MulAdd(expm1_r, two_to_n, two_to_n));
  }
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LT_TENSOR_CPU_EXP_INL_H_
