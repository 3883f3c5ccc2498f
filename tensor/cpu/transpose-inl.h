// Square register transposes, shared by the GEMM's packing (tensor/cpu/gemm.cc) and attention's key and
// value blocks (tensor/cpu/attention.cc). A Highway per-target header: it is included once per target
// from inside each file's foreach_target pass, hence the toggling guard rather than a plain one.
#if defined(LT_TENSOR_CPU_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef LT_TENSOR_CPU_TRANSPOSE_INL_H_
#undef LT_TENSOR_CPU_TRANSPOSE_INL_H_
#else
#define LT_TENSOR_CPU_TRANSPOSE_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// TransposeBlock for 8 lanes of 32 bits (AVX2). There ConcatEven and ConcatOdd each take two shuffles,
// one of them across the 128-bit halves, so unzipping would cost 48 shuffles per 64 elements (0.75 per
// element, ~12% of an M = 256 GEMM whose transposed b it packs). Instead each register is loaded with
// row i in its lower half and row i + 4 in its upper half (a 128-bit load and an insert), which leaves
// two 4 x 4 transposes within the halves: 16 shuffles, none across them.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void TransposeBlockOf8(D d, const T* HWY_RESTRICT src, int64_t src_stride, T* HWY_RESTRICT dst,
                                  int64_t dst_stride) {
  const hn::Half<D> half;
  const hn::Repartition<std::conditional_t<hwy::IsFloat<T>(), double, uint64_t>, D> pairs;
  HWY_UNROLL(2)
  for (int64_t t0 = 0; t0 < 8; t0 += 4) {  // columns t0 .. t0 + 3 of the 8 rows
    hn::Vec<D> rows[4];
    HWY_UNROLL(4)
    for (int64_t i = 0; i < 4; ++i)
      rows[i] = hn::Combine(d, hn::LoadU(half, src + (i + 4) * src_stride + t0),
                            hn::LoadU(half, src + i * src_stride + t0));
    // Per half: [r0[t] r1[t] r0[t+1] r1[t+1]] and [.. t+2, t+3], then pairs of those make whole columns.
    const auto r01_lo = hn::BitCast(pairs, hn::InterleaveLower(d, rows[0], rows[1]));
    const auto r01_hi = hn::BitCast(pairs, hn::InterleaveUpper(d, rows[0], rows[1]));
    const auto r23_lo = hn::BitCast(pairs, hn::InterleaveLower(d, rows[2], rows[3]));
    const auto r23_hi = hn::BitCast(pairs, hn::InterleaveUpper(d, rows[2], rows[3]));
    hn::StoreU(hn::BitCast(d, hn::InterleaveLower(pairs, r01_lo, r23_lo)), d, dst + (t0 + 0) * dst_stride);
    hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(pairs, r01_lo, r23_lo)), d, dst + (t0 + 1) * dst_stride);
    hn::StoreU(hn::BitCast(d, hn::InterleaveLower(pairs, r01_hi, r23_hi)), d, dst + (t0 + 2) * dst_stride);
    hn::StoreU(hn::BitCast(d, hn::InterleaveUpper(pairs, r01_hi, r23_hi)), d, dst + (t0 + 3) * dst_stride);
  }
}

// dst[t * dst_stride + i] = src[i * src_stride + t] for i, t < Lanes(d): a square transpose in
// registers by log2(Lanes) rounds of unzipping pairs of rows (ConcatEven / ConcatOdd), one shuffle per
// row and round: ~0.25 shuffles per element for 16 lanes, against a load and a store per element for
// a scalar transpose.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void TransposeBlock(D d, const T* HWY_RESTRICT src, int64_t src_stride, T* HWY_RESTRICT dst,
                               int64_t dst_stride) {
  if constexpr (sizeof(T) == 4 && hn::MaxLanes(D()) == 8) {
    TransposeBlockOf8(d, src, src_stride, dst, dst_stride);
  } else {
    // Fully unrolled (16 = f32 lanes of AVX-512) so that the rows stay in registers.
    constexpr size_t kMaxLanes = hn::MaxLanes(D());
    const size_t lanes = hn::Lanes(d), half = lanes / 2;
    hn::Vec<D> rows[kMaxLanes], unzipped[kMaxLanes];
    HWY_UNROLL(16)
    for (size_t i = 0; i < lanes; ++i) rows[i] = hn::LoadU(d, src + static_cast<int64_t>(i) * src_stride);
    for (size_t width = 1; width < lanes; width *= 2) {
      HWY_UNROLL(16)
      for (size_t i = 0; i < half; ++i) {
        unzipped[i] = hn::ConcatEven(d, rows[2 * i + 1], rows[2 * i]);
        unzipped[i + half] = hn::ConcatOdd(d, rows[2 * i + 1], rows[2 * i]);
      }
      HWY_UNROLL(16)
      for (size_t i = 0; i < lanes; ++i) rows[i] = unzipped[i];
    }
    HWY_UNROLL(16)
    for (size_t t = 0; t < lanes; ++t) hn::StoreU(rows[t], d, dst + static_cast<int64_t>(t) * dst_stride);
  }
}
#endif

// dst[i * dst_stride + c] = src[c * src_stride + i] for c < rows, i < cols: a [rows, cols] matrix
// transposed, in Lanes x Lanes register blocks where they fit and element by element at the edges.
template <class T>
void TransposeMatrix(const T* HWY_RESTRICT src, int64_t src_stride, int64_t rows, int64_t cols,
                     T* HWY_RESTRICT dst, int64_t dst_stride) {
  int64_t full_rows = 0, full_cols = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  full_rows = rows / lanes * lanes;
  full_cols = cols / lanes * lanes;
  for (int64_t c = 0; c < full_rows; c += lanes)
    for (int64_t i = 0; i < full_cols; i += lanes)
      TransposeBlock(d, src + c * src_stride + i, src_stride, dst + i * dst_stride + c, dst_stride);
#endif
  for (int64_t c = 0; c < rows; ++c)
    for (int64_t i = c < full_rows ? full_cols : 0; i < cols; ++i) dst[i * dst_stride + c] = src[c * src_stride + i];
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // LT_TENSOR_CPU_TRANSPOSE_INL_H_
