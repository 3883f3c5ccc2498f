// Reductions: the sum of all elements, and sums over the last dimension.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/reduce.cc"
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Sum of x[0, n): vector lanes accumulate independently, then are reduced; the order is fixed by n
// and the vector width, so the result is the same every run on one machine.
template <class T>
HWY_INLINE T SumSpan(const T* x, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc0 = hn::Zero(d), acc1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    acc0 = hn::Add(acc0, hn::LoadU(d, x + i));
    acc1 = hn::Add(acc1, hn::LoadU(d, x + i + lanes));
  }
  for (; i + lanes <= n; i += lanes) acc0 = hn::Add(acc0, hn::LoadU(d, x + i));
  T total = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc0, acc1)));
  for (; i < n; ++i) total += x[i];
  return total;
}

template <class T>
void SumAllT(const T* x, T* out, int64_t n) {
  // Per-chunk partial sums combined in chunk order: the same bits whatever the thread count.
  const int64_t grain = 1 << 15;
  const int64_t chunks = std::max<int64_t>(reduction_chunks(n, grain), 1);
  std::vector<T> partial(static_cast<size_t>(chunks), T(0));
  parallel_for_chunks(n, grain, [&](int64_t chunk, int64_t begin, int64_t end) {
    partial[static_cast<size_t>(chunk)] = SumSpan(x + begin, end - begin);
  });
  T total = 0;
  for (T p : partial) total += p;
  *out = total;
}

void SumAllKernel(DType dtype, const void* x, void* out, int64_t n) {
  LT_FLOAT_SWITCH(dtype, T, SumAllT<T>(static_cast<const T*>(x), static_cast<T*>(out), n));
}

template <class T>
HWY_INLINE T SumSquaresSpan(const T* x, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    acc = hn::MulAdd(v, v, acc);
  }
  T total = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) total += x[i] * x[i];
  return total;
}

// Partial sums in f64 per chunk (gradient norms of millions of f32 values), combined in chunk order.
template <class T>
void SumSquaresT(const T* x, T* out, int64_t n) {
  const int64_t grain = 1 << 15;
  std::vector<double> partial(static_cast<size_t>(std::max<int64_t>(reduction_chunks(n, grain), 1)), 0.0);
  parallel_for_chunks(n, grain, [&](int64_t chunk, int64_t begin, int64_t end) {
    double total = 0;
    for (int64_t i = begin; i < end; i += 4096) total += SumSquaresSpan(x + i, std::min<int64_t>(4096, end - i));
    partial[static_cast<size_t>(chunk)] = total;
  });
  double total = 0;
  for (double p : partial) total += p;
  *out = static_cast<T>(total);
}

void SumSquaresKernel(DType dtype, const void* x, void* out, int64_t n) {
  LT_FLOAT_SWITCH(dtype, T, SumSquaresT<T>(static_cast<const T*>(x), static_cast<T*>(out), n));
}

template <class T>
void SumLastDimT(const T* x, T* out, int64_t rows, int64_t n) {
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) out[r] = SumSpan(x + r * n, n);
  });
}

void SumLastDimKernel(DType dtype, const void* x, void* out, int64_t rows, int64_t n) {
  LT_FLOAT_SWITCH(dtype, T, SumLastDimT<T>(static_cast<const T*>(x), static_cast<T*>(out), rows, n));
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(SumAllKernel);
HWY_EXPORT(SumLastDimKernel);
HWY_EXPORT(SumSquaresKernel);

void sum(const Tensor& x, Tensor& out) {
  HWY_DYNAMIC_DISPATCH(SumAllKernel)(x.dtype(), x.raw_data(), out.raw_data(), x.numel());
}

void sum_squares(const Tensor& x, Tensor& out) {
  HWY_DYNAMIC_DISPATCH(SumSquaresKernel)(x.dtype(), x.raw_data(), out.raw_data(), x.numel());
}

void sum_last_dim(const Tensor& x, Tensor& out) {
  HWY_DYNAMIC_DISPATCH(SumLastDimKernel)(x.dtype(), x.raw_data(), out.raw_data(), out.numel(), x.dim(-1));
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
