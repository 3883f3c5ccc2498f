// RMSNorm over the last dimension: y = (x * rstd) * w, rstd = 1 / sqrt(mean(x^2) + eps).
//
// Numerics: the row statistics (sum of squares, and the dot product of the backward) are accumulated
// in f64 whatever the input dtype, so long rows lose no precision and f32 values up to ~1e38 square
// without overflow. x * rstd is formed in the input dtype before the weight multiplies it, the order
// of the Hugging Face reference.
//
// Backward, per row with g = w * dy:
//   dx = rstd * g - x * rstd^3 * mean(g * x)
//   dw += sum over rows of dy * (x * rstd)
// Rows are cut into reduction chunks fixed by N and C (not by the thread count); each chunk sums its dw
// contribution into its own partial buffer, and the partials are added in chunk order, so dw has the
// same bits run after run and with any number of threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/norm.cc"
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/bf16-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rows per chunk: enough elements per chunk that the threading overhead stays small.
static int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

// Loads as many T values as dd has f64 lanes, widened to f64.
template <class DD, class T>
HWY_INLINE hn::Vec<DD> LoadAsF64(DD dd, const T* p) {
  if constexpr (std::is_same_v<T, double>) {
    return hn::LoadU(dd, p);
  } else {
    const hn::Rebind<T, DD> dt;
    return hn::PromoteTo(dd, hn::LoadU(dt, p));
  }
}

// sum of x[i]^2 over [0, n), in f64. Lanes accumulate independently and are reduced at the end: the
// order depends only on n and the vector width.
template <class T>
HWY_INLINE double SumSquaresF64(const T* x, int64_t n) {
  const hn::ScalableTag<double> dd;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  auto acc0 = hn::Zero(dd), acc1 = hn::Zero(dd);
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto v0 = LoadAsF64(dd, x + i), v1 = LoadAsF64(dd, x + i + lanes);
    acc0 = hn::MulAdd(v0, v0, acc0);
    acc1 = hn::MulAdd(v1, v1, acc1);
  }
  for (; i + lanes <= n; i += lanes) {
    const auto v = LoadAsF64(dd, x + i);
    acc0 = hn::MulAdd(v, v, acc0);
  }
  double total = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
  for (; i < n; ++i) total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return total;
}

// sum of a[i] * b[i] * c[i] over [0, n), in f64.
template <class T>
HWY_INLINE double TripleDotF64(const T* a, const T* b, const T* c, int64_t n) {
  const hn::ScalableTag<double> dd;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  auto acc = hn::Zero(dd);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    acc = hn::MulAdd(hn::Mul(LoadAsF64(dd, a + i), LoadAsF64(dd, b + i)), LoadAsF64(dd, c + i), acc);
  double total = hn::GetLane(hn::SumOfLanes(dd, acc));
  for (; i < n; ++i) total += static_cast<double>(a[i]) * static_cast<double>(b[i]) * static_cast<double>(c[i]);
  return total;
}

// Normalises one row x [C] into y, returning its rstd.
template <class T>
HWY_INLINE T NormalizeRow(const T* x, const T* w_C, double eps, T* y, int64_t C) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const T r = static_cast<T>(1.0 / std::sqrt(SumSquaresF64(x, C) / static_cast<double>(C) + eps));
  const auto rv = hn::Set(d, r);
  int64_t j = 0;
  for (; j + lanes <= C; j += lanes)
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + j), rv), hn::LoadU(d, w_C + j)), d, y + j);
  for (; j < C; ++j) y[j] = (x[j] * r) * w_C[j];
  return r;
}

// Under mixed precision (f32, tensor/kernels.h) a row's bf16 copies are rounded while the row is in cache:
// x's (or the sum's) for the norm's backward, y's for the projections that read y (autograd/saved.h).
struct RowCopies {
  uint16_t* x = nullptr;
  uint16_t* y = nullptr;
};
template <class T>
HWY_INLINE void CopyRows(const RowCopies& copies, const T* x, const T* y, int64_t n, int64_t C) {
  if constexpr (std::is_same_v<T, float>) {
    if (copies.x) RoundRowToBf16(x, C, copies.x + n * C);
    if (copies.y) RoundRowToBf16(y, C, copies.y + n * C);
  }
}

template <class T>
void RmsNormT(const T* x_NC, const T* w_C, double eps, T* y_NC, T* rstd_N, int64_t N, int64_t C,
              const RowCopies& copies) {
  parallel_for(N, row_grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      rstd_N[n] = NormalizeRow(x_NC + n * C, w_C, eps, y_NC + n * C, C);
      CopyRows(copies, x_NC + n * C, y_NC + n * C, n, C);
    }
  });
}

// Each row's sum is normalised while it is still in cache: one pass over the residual stream fewer than
// add then rmsnorm, with the same bits (the sum rounded to T, then read back as rmsnorm reads x).
template <class T>
void AddRmsNormT(const T* a_NC, const T* b_NC, const T* w_C, double eps, T* sum_NC, T* y_NC, T* rstd_N, int64_t N,
                 int64_t C, const RowCopies& copies) {
  parallel_for(N, row_grain(C), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t n = begin; n < end; ++n) {
      const T* a = a_NC + n * C;
      const T* b = b_NC + n * C;
      T* sum = sum_NC + n * C;
      int64_t j = 0;
      for (; j + lanes <= C; j += lanes) hn::StoreU(hn::Add(hn::LoadU(d, a + j), hn::LoadU(d, b + j)), d, sum + j);
      for (; j < C; ++j) sum[j] = a[j] + b[j];
      rstd_N[n] = NormalizeRow(sum, w_C, eps, y_NC + n * C, C);
      CopyRows(copies, sum, y_NC + n * C, n, C);
    }
  });
}

// X: x's element type, T's or bf16 (uint16_t: the kept copy under mixed precision, each row widened into
// a per-thread row as it is reached, so the arithmetic is that of the f32 kernel on the widened tensor).
template <class T, class X>
void RmsNormBackwardT(const X* x_NC, const T* w_C, const T* rstd_N, const T* dy_NC, T* dx_NC, T* dw_C, int64_t N,
                      int64_t C, bool add_to_dx) {
  // Per-chunk dw partials, kept between calls so steady-state steps allocate nothing.
  static thread_local std::vector<T> partial_dw;
  const int64_t grain = row_grain(C);
  const int64_t chunks = reduction_chunks(N, grain);
  partial_dw.assign(static_cast<size_t>(chunks * C), T(0));
  T* partials = partial_dw.data();

  parallel_for_chunks(N, grain, [&](int64_t chunk, int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    T* dw_part = partials + chunk * C;
    static thread_local std::vector<T> widened_row;
    for (int64_t n = begin; n < end; ++n) {
      const T* x = nullptr;
      if constexpr (std::is_same_v<X, T>) {
        x = x_NC + n * C;
      } else {
        widened_row.resize(static_cast<size_t>(C));
        WidenRowFromBf16(x_NC + n * C, C, widened_row.data());
        x = widened_row.data();
      }
      const T* dy = dy_NC + n * C;
      T* dx = dx_NC + n * C;
      const double r = static_cast<double>(rstd_N[n]);
      const double mean_gx = TripleDotF64(w_C, dy, x, C) / static_cast<double>(C);
      const T rt = static_cast<T>(r);
      const T coef = static_cast<T>(r * r * r * mean_gx);
      const auto rv = hn::Set(d, rt), coefv = hn::Set(d, coef);
      int64_t j = 0;
      for (; j + lanes <= C; j += lanes) {
        const auto xv = hn::LoadU(d, x + j), dyv = hn::LoadU(d, dy + j);
        const auto g = hn::Mul(hn::LoadU(d, w_C + j), dyv);
        const auto dxv = hn::NegMulAdd(coefv, xv, hn::Mul(rv, g));
        hn::StoreU(add_to_dx ? hn::Add(dxv, hn::LoadU(d, dx + j)) : dxv, d, dx + j);
        hn::StoreU(hn::MulAdd(dyv, hn::Mul(xv, rv), hn::LoadU(d, dw_part + j)), d, dw_part + j);
      }
      for (; j < C; ++j) {
        const T value = rt * (w_C[j] * dy[j]) - coef * x[j];
        dx[j] = add_to_dx ? value + dx[j] : value;
        dw_part[j] += dy[j] * (x[j] * rt);
      }
    }
  });

  for (int64_t j = 0; j < C; ++j) {
    T total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += partials[c * C + j];
    dw_C[j] += total;
  }
}

void RmsNormKernel(DType dtype, const void* x, const void* w, double eps, void* y, void* rstd, int64_t N, int64_t C,
                   uint16_t* x_bf16, uint16_t* y_bf16) {
  const RowCopies copies{x_bf16, y_bf16};
  LT_FLOAT_SWITCH(dtype, T,
                  RmsNormT<T>(static_cast<const T*>(x), static_cast<const T*>(w), eps, static_cast<T*>(y),
                              static_cast<T*>(rstd), N, C, copies));
}

void AddRmsNormKernel(DType dtype, const void* a, const void* b, const void* w, double eps, void* sum, void* y,
                      void* rstd, int64_t N, int64_t C, uint16_t* sum_bf16, uint16_t* y_bf16) {
  const RowCopies copies{sum_bf16, y_bf16};
  LT_FLOAT_SWITCH(dtype, T,
                  AddRmsNormT<T>(static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const T*>(w), eps,
                                 static_cast<T*>(sum), static_cast<T*>(y), static_cast<T*>(rstd), N, C, copies));
}

void RmsNormBackwardKernel(DType dtype, const void* x, bool x_bf16, const void* w, const void* rstd, const void* dy,
                           void* dx, void* dw, int64_t N, int64_t C, bool add_to_dx) {
  if (x_bf16)
    return RmsNormBackwardT<float>(static_cast<const uint16_t*>(x), static_cast<const float*>(w),
                                   static_cast<const float*>(rstd), static_cast<const float*>(dy),
                                   static_cast<float*>(dx), static_cast<float*>(dw), N, C, add_to_dx);
  LT_FLOAT_SWITCH(
      dtype, T,
      RmsNormBackwardT<T>(static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(rstd),
                          static_cast<const T*>(dy), static_cast<T*>(dx), static_cast<T*>(dw), N, C, add_to_dx));
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(RmsNormKernel);
HWY_EXPORT(AddRmsNormKernel);
HWY_EXPORT(RmsNormBackwardKernel);

namespace {
uint16_t* bf16_or_null(const Tensor& t) { return t.defined() ? t.bf16_data() : nullptr; }
}  // namespace

void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd, const Tensor& x_bf16,
             const Tensor& y_bf16) {
  const int64_t C = x.dim(-1);
  HWY_DYNAMIC_DISPATCH(RmsNormKernel)(x.dtype(), x.raw_data(), w.raw_data(), eps, y.raw_data(), rstd.raw_data(),
                                      x.numel() / C, C, bf16_or_null(x_bf16), bf16_or_null(y_bf16));
}

void add_rmsnorm(const Tensor& a, const Tensor& b, const Tensor& w, double eps, Tensor& sum, Tensor& y, Tensor& rstd,
                 const Tensor& sum_bf16, const Tensor& y_bf16) {
  const int64_t C = a.dim(-1);
  HWY_DYNAMIC_DISPATCH(AddRmsNormKernel)(a.dtype(), a.raw_data(), b.raw_data(), w.raw_data(), eps, sum.raw_data(),
                                         y.raw_data(), rstd.raw_data(), a.numel() / C, C,
                                         bf16_or_null(sum_bf16), bf16_or_null(y_bf16));
}

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      bool add_to_dx) {
  const int64_t C = x.dim(-1);
  HWY_DYNAMIC_DISPATCH(RmsNormBackwardKernel)
  (dy.dtype(), x.raw_data(), x.dtype() == DType::BF16, w.raw_data(), rstd.raw_data(), dy.raw_data(), dx.raw_data(),
   dw.raw_data(), x.numel() / C, C, add_to_dx);
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
