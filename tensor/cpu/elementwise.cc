// Elementwise kernels: add, sub, mul with broadcasting over leading dims, scale, axpy, sum_to.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/elementwise.cc"
#include <algorithm>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/column_sum_chunks.h"
#include "tensor/cpu/bf16-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <BinaryOp kOp, class V>
HWY_INLINE V Apply(V a, V b) {
  if constexpr (kOp == BinaryOp::Add) return hn::Add(a, b);
  if constexpr (kOp == BinaryOp::Sub) return hn::Sub(a, b);
  return hn::Mul(a, b);
}
template <BinaryOp kOp, class T>
HWY_INLINE T ApplyScalar(T a, T b) {
  if constexpr (kOp == BinaryOp::Add) return a + b;
  if constexpr (kOp == BinaryOp::Sub) return a - b;
  return a * b;
}

// out[i] = a[i] op b[i % inner] over the flat range [begin, end).
template <BinaryOp kOp, class T>
void BinaryRange(const T* a, const T* b, T* out, int64_t begin, int64_t end, int64_t inner) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = begin;
  while (i < end) {
    const int64_t row_start = i / inner * inner;
    const int64_t seg_end = std::min(end, row_start + inner);
    const T* b_row = b - row_start;
    for (; i + lanes <= seg_end; i += lanes)
      hn::StoreU(Apply<kOp>(hn::LoadU(d, a + i), hn::LoadU(d, b_row + i)), d, out + i);
    for (; i < seg_end; ++i) out[i] = ApplyScalar<kOp>(a[i], b_row[i]);
  }
}

template <BinaryOp kOp, class T>
void Binary(const T* a, const T* b, T* out, int64_t n, int64_t inner) {
  parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) { BinaryRange<kOp>(a, b, out, begin, end, inner); });
}

void BinaryKernel(BinaryOp op, DType dtype, const void* a, const void* b, void* out, int64_t n, int64_t inner) {
  LT_FLOAT_SWITCH(dtype, T, {
    const T* ta = static_cast<const T*>(a);
    const T* tb = static_cast<const T*>(b);
    T* to = static_cast<T*>(out);
    if (op == BinaryOp::Add) Binary<BinaryOp::Add>(ta, tb, to, n, inner);
    else if (op == BinaryOp::Sub) Binary<BinaryOp::Sub>(ta, tb, to, n, inner);
    else Binary<BinaryOp::Mul>(ta, tb, to, n, inner);
  });
}

// y = alpha * x + beta * y (beta 0 means y is only written, never read).
template <class T>
void AxpbyT(T alpha, const T* x, T beta, T* y, int64_t n) {
  parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    const auto va = hn::Set(d, alpha), vb = hn::Set(d, beta);
    int64_t i = begin;
    if (beta == T(0)) {
      for (; i + lanes <= end; i += lanes) hn::StoreU(hn::Mul(va, hn::LoadU(d, x + i)), d, y + i);
      for (; i < end; ++i) y[i] = alpha * x[i];
    } else {
      for (; i + lanes <= end; i += lanes)
        hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::Mul(vb, hn::LoadU(d, y + i))), d, y + i);
      for (; i < end; ++i) y[i] = alpha * x[i] + beta * y[i];
    }
  });
}

void AxpbyKernel(DType dtype, double alpha, const void* x, double beta, void* y, int64_t n) {
  LT_FLOAT_SWITCH(dtype, T, AxpbyT<T>(T(alpha), static_cast<const T*>(x), T(beta), static_cast<T*>(y), n));
}

// out[j] = sum over rows r of x[r, j], x [rows, inner]. Parallel over columns; each column is summed
// in the chunked row order of tensor/column_sum_chunks.h, which the CUDA kernel shares, so the result
// does not depend on the thread count at all and the GPU's has the same bits.
template <class T>
void SumRowsT(const T* x, T* out, int64_t rows, int64_t inner) {
  parallel_for(inner, 256, [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    int64_t j = begin;
    for (; j + lanes <= end; j += lanes) {
      auto total = hn::Zero(d);
      for (int64_t r0 = 0; r0 < rows; r0 += kColumnSumChunkRows) {
        const int64_t r1 = std::min(rows, r0 + kColumnSumChunkRows);
        auto chunk = hn::Zero(d);
        for (int64_t r = r0; r < r1; ++r) chunk = hn::Add(chunk, hn::LoadU(d, x + r * inner + j));
        total = hn::Add(total, chunk);
      }
      hn::StoreU(total, d, out + j);
    }
    for (; j < end; ++j) {
      T total = 0;
      for (int64_t r0 = 0; r0 < rows; r0 += kColumnSumChunkRows) {
        const int64_t r1 = std::min(rows, r0 + kColumnSumChunkRows);
        T chunk = 0;
        for (int64_t r = r0; r < r1; ++r) chunk += x[r * inner + j];
        total += chunk;
      }
      out[j] = total;
    }
  });
}

void SumRowsKernel(DType dtype, const void* x, void* out, int64_t rows, int64_t inner) {
  LT_FLOAT_SWITCH(dtype, T, SumRowsT<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, inner));
}

// dst = the bf16 of src (f32_to_bf16), and dst = src widened (bf16_to_f32), for n elements.
void RoundToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  parallel_for(n, 1 << 15,
               [src, dst](int64_t begin, int64_t end) { RoundRowToBf16(src + begin, end - begin, dst + begin); });
}
void WidenBf16Kernel(const uint16_t* src, float* dst, int64_t n) {
  parallel_for(n, 1 << 15,
               [src, dst](int64_t begin, int64_t end) { WidenRowFromBf16(src + begin, end - begin, dst + begin); });
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(BinaryKernel);
HWY_EXPORT(AxpbyKernel);
HWY_EXPORT(SumRowsKernel);
HWY_EXPORT(RoundToBf16Kernel);
HWY_EXPORT(WidenBf16Kernel);

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, int64_t inner) {
  HWY_DYNAMIC_DISPATCH(BinaryKernel)(op, a.dtype(), a.raw_data(), b.raw_data(), out.raw_data(), a.numel(), inner);
}

void axpby(double alpha, const Tensor& x, double beta, Tensor& y) {
  HWY_DYNAMIC_DISPATCH(AxpbyKernel)(x.dtype(), alpha, x.raw_data(), beta, y.raw_data(), x.numel());
}

void axpby_by(const Tensor& s, double factor, const Tensor& x, double beta, Tensor& y) {
  const double value = s.dtype() == DType::F32 ? static_cast<double>(s.data<float>()[0]) : s.data<double>()[0];
  axpby(factor * value, x, beta, y);
}

void sum_to(const Tensor& x, Tensor& out) {
  const int64_t inner = out.numel();
  HWY_DYNAMIC_DISPATCH(SumRowsKernel)(x.dtype(), x.raw_data(), out.raw_data(), inner ? x.numel() / inner : 0, inner);
}

// With the bits of the scalar conversions of tensor/dtype.h (tensor/cpu/bf16-inl.h), threads taking
// chunks: under --dtype bf16 the activations kept for the backward go through here (autograd/saved.h).
void convert(const Tensor& x, Tensor& y) {
  if (x.dtype() == DType::F32) HWY_DYNAMIC_DISPATCH(RoundToBf16Kernel)(x.data<float>(), y.bf16_data(), x.numel());
  else HWY_DYNAMIC_DISPATCH(WidenBf16Kernel)(x.bf16_data(), y.data<float>(), x.numel());
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
