// Elementwise kernels: add, sub, mul with broadcasting over leading dims, scale, axpy, sum_to.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernel_util.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::kernels::HWY_NAMESPACE {
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
// in row order, so the result does not depend on the thread count at all.
template <class T>
void SumRowsT(const T* x, T* out, int64_t rows, int64_t inner) {
  parallel_for(inner, 256, [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    int64_t j = begin;
    for (; j + lanes <= end; j += lanes) {
      auto acc = hn::Zero(d);
      for (int64_t r = 0; r < rows; ++r) acc = hn::Add(acc, hn::LoadU(d, x + r * inner + j));
      hn::StoreU(acc, d, out + j);
    }
    for (; j < end; ++j) {
      T acc = 0;
      for (int64_t r = 0; r < rows; ++r) acc += x[r * inner + j];
      out[j] = acc;
    }
  });
}

void SumRowsKernel(DType dtype, const void* x, void* out, int64_t rows, int64_t inner) {
  LT_FLOAT_SWITCH(dtype, T, SumRowsT<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, inner));
}

}  // namespace lt::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::kernels {
HWY_EXPORT(BinaryKernel);
HWY_EXPORT(AxpbyKernel);
HWY_EXPORT(SumRowsKernel);

namespace {
// The size of the trailing part of a's shape that b's shape equals (b broadcasts over the rest).
int64_t broadcast_inner(const Tensor& a, const Tensor& b, const char* op) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  bool suffix = sb.size() <= sa.size();
  for (size_t i = 0; suffix && i < sb.size(); ++i) suffix = sb[sb.size() - 1 - i] == sa[sa.size() - 1 - i];
  LT_CHECK(suffix, op, ": cannot broadcast ", shape_str(sb), " over ", shape_str(sa));
  return b.numel();
}

void binary(BinaryOp op, const char* name, const Tensor& a, const Tensor& b, Tensor& out) {
  check_float(a, name, "a");
  check_like(b, a, name, "b");
  check_like(out, a, name, "out");
  check_shape(out, a.shape(), name, "out");
  const int64_t inner = broadcast_inner(a, b, name);
  if (a.numel() == 0) return;
#ifdef LINGTRAIN_CUDA
  if (!a.is_cpu()) return cuda::binary(op, a, b, out, inner);
#endif
  HWY_DYNAMIC_DISPATCH(BinaryKernel)(op, a.dtype(), a.raw_data(), b.raw_data(), out.raw_data(), a.numel(), inner);
}
}  // namespace

void add(const Tensor& a, const Tensor& b, Tensor& out) { binary(BinaryOp::Add, "add", a, b, out); }
void sub(const Tensor& a, const Tensor& b, Tensor& out) { binary(BinaryOp::Sub, "sub", a, b, out); }
void mul(const Tensor& a, const Tensor& b, Tensor& out) { binary(BinaryOp::Mul, "mul", a, b, out); }

void scale(const Tensor& x, double alpha, Tensor& out) {
  check_float(x, "scale", "x");
  check_like(out, x, "scale", "out");
  check_shape(out, x.shape(), "scale", "out");
#ifdef LINGTRAIN_CUDA
  if (!x.is_cpu()) return cuda::axpby(alpha, x, 0.0, out);
#endif
  HWY_DYNAMIC_DISPATCH(AxpbyKernel)(x.dtype(), alpha, x.raw_data(), 0.0, out.raw_data(), x.numel());
}

void axpy(double alpha, const Tensor& x, Tensor& y) {
  check_float(x, "axpy", "x");
  check_like(y, x, "axpy", "y");
  check_shape(y, x.shape(), "axpy", "y");
#ifdef LINGTRAIN_CUDA
  if (!x.is_cpu()) return cuda::axpby(alpha, x, 1.0, y);
#endif
  HWY_DYNAMIC_DISPATCH(AxpbyKernel)(x.dtype(), alpha, x.raw_data(), 1.0, y.raw_data(), x.numel());
}

void sum_to(const Tensor& x, Tensor& out) {
  check_float(x, "sum_to", "x");
  check_like(out, x, "sum_to", "out");
  const int64_t inner = broadcast_inner(x, out, "sum_to");
  require_cpu(x, "sum_to");
  HWY_DYNAMIC_DISPATCH(SumRowsKernel)(x.dtype(), x.raw_data(), out.raw_data(), inner ? x.numel() / inner : 0, inner);
}

}  // namespace lt::kernels
#endif  // HWY_ONCE
