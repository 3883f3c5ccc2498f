// Softmax, log-softmax and cross-entropy over the last dimension, forward and backward.
//
// Numerics: every row is shifted by its maximum (or its logsumexp) before exp, so exp sees values <= 0
// and never overflows, whatever the magnitude of the logits; it is ExpNonPositive (tensor/cpu/exp-inl.h,
// about 1 ulp). Row sums (of exp, and the dot products of the backward) are added in vectors of the
// input dtype within blocks of kSumBlock elements and the block totals in f64, so a 150k-wide
// vocabulary row in f32 accumulates the rounding error of a short one. log-softmax is formed as
// (x - max) - log(sum), which stays exact near the maximum.
//
// The last partial vector of a row is run through the same vector code on a padded copy: padding
// with -inf makes exp return 0, and padding with 0 adds nothing to a sum.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/softmax.cc"
#include <algorithm>
#include <cmath>
#include <limits>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/exp-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A multiple of every vector width, so only the last block of a row has a partial vector.
constexpr int64_t kSumBlock = 1024;

static int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)); }

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// count (<= lanes) values from p; lanes past count hold `fill`.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE hn::Vec<D> LoadPart(D d, const T* p, int64_t count, T fill) {
  if (count == static_cast<int64_t>(hn::Lanes(d))) return hn::LoadU(d, p);
  T padded[HWY_LANES(T)];
  std::fill(padded, padded + hn::Lanes(d), fill);
  std::copy(p, p + count, padded);
  return hn::LoadU(d, padded);
}

// Stores the first count (<= lanes) lanes of v to p.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void StorePart(D d, hn::Vec<D> v, T* p, int64_t count) {
  if (count == static_cast<int64_t>(hn::Lanes(d))) return hn::StoreU(v, d, p);
  T padded[HWY_LANES(T)];
  hn::StoreU(v, d, padded);
  std::copy(padded, padded + count, p);
}

// fn(i, count) for each vector of a row of n elements: count == lanes except for the last.
template <class D, class Fn>
HWY_INLINE void ForEachVector(D d, int64_t n, const Fn& fn) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < n; i += lanes) fn(i, std::min(lanes, n - i));
}

// The sum over a row of n elements of term(i, count), a vector whose lanes past count are 0.
template <class D, class Term>
HWY_INLINE double RowSum(D d, int64_t n, const Term& term) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  double total = 0;
  for (int64_t block = 0; block < n; block += kSumBlock) {
    const int64_t block_end = std::min(n, block + kSumBlock);
    auto acc = hn::Zero(d);
    for (int64_t i = block; i < block_end; i += lanes) acc = hn::Add(acc, term(i, std::min(lanes, block_end - i)));
    total += static_cast<double>(hn::GetLane(hn::SumOfLanes(d, acc)));
  }
  return total;
}

template <class D, class T = hn::TFromD<D>>
HWY_INLINE T RowMax(D d, const T* x, int64_t n) {
  auto running = hn::Set(d, kNegInf<T>);
  ForEachVector(d, n, [&](int64_t i, int64_t count) {
    running = hn::Max(running, LoadPart(d, x + i, count, kNegInf<T>));
  });
  return hn::GetLane(hn::MaxOfLanes(d, running));
}

// sum of exp(x - shift) over a row; with store_to set, also writes each exp(x - shift) there.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE double RowSumExp(D d, const T* x, int64_t n, T shift, T* store_to) {
  const auto shift_v = hn::Set(d, shift);
  return RowSum(d, n, [&](int64_t i, int64_t count) {
    const auto e = ExpNonPositive(d, hn::Sub(LoadPart(d, x + i, count, kNegInf<T>), shift_v));
    if (store_to) StorePart(d, e, store_to + i, count);
    return e;
  });
}

template <class T>
void SoftmaxT(const T* x_NV, T* y_NV, int64_t N, int64_t V) {
  parallel_for(N, row_grain(V), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    for (int64_t n = begin; n < end; ++n) {
      const T* x = x_NV + n * V;
      T* y = y_NV + n * V;
      const T max = RowMax(d, x, V);
      const auto inv_sum = hn::Set(d, static_cast<T>(1.0 / RowSumExp(d, x, V, max, y)));
      ForEachVector(d, V, [&](int64_t i, int64_t count) {
        StorePart(d, hn::Mul(LoadPart(d, y + i, count, T(0)), inv_sum), y + i, count);
      });
    }
  });
}

// dx = y * (dy - sum(y * dy)).
template <class T>
void SoftmaxBackwardT(const T* y_NV, const T* dy_NV, T* dx_NV, int64_t N, int64_t V) {
  parallel_for(N, row_grain(V), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    for (int64_t n = begin; n < end; ++n) {
      const T* y = y_NV + n * V;
      const T* dy = dy_NV + n * V;
      T* dx = dx_NV + n * V;
      const double dot = RowSum(d, V, [&](int64_t i, int64_t count) {
        return hn::Mul(LoadPart(d, y + i, count, T(0)), LoadPart(d, dy + i, count, T(0)));
      });
      const auto dot_v = hn::Set(d, static_cast<T>(dot));
      ForEachVector(d, V, [&](int64_t i, int64_t count) {
        const auto yv = LoadPart(d, y + i, count, T(0));
        StorePart(d, hn::Mul(yv, hn::Sub(LoadPart(d, dy + i, count, T(0)), dot_v)), dx + i, count);
      });
    }
  });
}

template <class T>
void LogSoftmaxT(const T* x_NV, T* y_NV, int64_t N, int64_t V) {
  parallel_for(N, row_grain(V), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    for (int64_t n = begin; n < end; ++n) {
      const T* x = x_NV + n * V;
      T* y = y_NV + n * V;
      const T max = RowMax(d, x, V);
      const auto max_v = hn::Set(d, max);
      const auto log_sum = hn::Set(d, static_cast<T>(std::log(RowSumExp(d, x, V, max, static_cast<T*>(nullptr)))));
      ForEachVector(d, V, [&](int64_t i, int64_t count) {
        StorePart(d, hn::Sub(hn::Sub(LoadPart(d, x + i, count, T(0)), max_v), log_sum), y + i, count);
      });
    }
  });
}

// With y = log_softmax(x): dx = dy - exp(y) * sum(dy).
template <class T>
void LogSoftmaxBackwardT(const T* y_NV, const T* dy_NV, T* dx_NV, int64_t N, int64_t V) {
  parallel_for(N, row_grain(V), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    for (int64_t n = begin; n < end; ++n) {
      const T* y = y_NV + n * V;
      const T* dy = dy_NV + n * V;
      T* dx = dx_NV + n * V;
      const double dy_sum = RowSum(d, V, [&](int64_t i, int64_t count) { return LoadPart(d, dy + i, count, T(0)); });
      const auto dy_sum_v = hn::Set(d, static_cast<T>(dy_sum));
      ForEachVector(d, V, [&](int64_t i, int64_t count) {
        const auto p = ExpNonPositive(d, LoadPart(d, y + i, count, T(0)));
        StorePart(d, hn::NegMulAdd(p, dy_sum_v, LoadPart(d, dy + i, count, T(0))), dx + i, count);
      });
    }
  });
}

// loss = lse - x[target] = (max - x[target]) + log(sum exp(x - max)), formed in f64 so that large
// logits do not cancel digits; lse itself is rounded to T only when stored.
template <class T, class I>
void CrossEntropyT(const T* x_NV, const I* target_N, int64_t ignore_index, T* loss_N, T* lse_N, int64_t N,
                   int64_t V) {
  parallel_for(N, row_grain(V), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    for (int64_t n = begin; n < end; ++n) {
      const T* x = x_NV + n * V;
      const T max = RowMax(d, x, V);
      const double log_sum = std::log(RowSumExp(d, x, V, max, static_cast<T*>(nullptr)));
      lse_N[n] = static_cast<T>(static_cast<double>(max) + log_sum);
      const int64_t target = static_cast<int64_t>(target_N[n]);
      loss_N[n] = target == ignore_index
                      ? T(0)
                      : static_cast<T>(static_cast<double>(max) - static_cast<double>(x[target]) + log_sum);
    }
  });
}

// dx = dloss * (exp(x - lse) - onehot(target)); zero rows where the target is ignored.
template <class T, class I>
void CrossEntropyBackwardT(const T* x_NV, const I* target_N, int64_t ignore_index, const T* lse_N, const T* dloss_N,
                           T* dx_NV, int64_t N, int64_t V) {
  parallel_for(N, row_grain(V), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    for (int64_t n = begin; n < end; ++n) {
      const T* x = x_NV + n * V;
      T* dx = dx_NV + n * V;
      const int64_t target = static_cast<int64_t>(target_N[n]);
      if (target == ignore_index) {
        std::fill(dx, dx + V, T(0));
        continue;
      }
      const auto lse = hn::Set(d, lse_N[n]), dloss = hn::Set(d, dloss_N[n]);
      ForEachVector(d, V, [&](int64_t i, int64_t count) {
        const auto p = ExpNonPositive(d, hn::Sub(LoadPart(d, x + i, count, T(0)), lse));
        StorePart(d, hn::Mul(dloss, p), dx + i, count);
      });
      dx[target] -= dloss_N[n];
    }
  });
}

void SoftmaxKernel(DType dtype, bool log, const void* x, void* y, int64_t N, int64_t V) {
  LT_FLOAT_SWITCH(dtype, T, {
    if (log) LogSoftmaxT<T>(static_cast<const T*>(x), static_cast<T*>(y), N, V);
    else SoftmaxT<T>(static_cast<const T*>(x), static_cast<T*>(y), N, V);
  });
}

void SoftmaxBackwardKernel(DType dtype, bool log, const void* y, const void* dy, void* dx, int64_t N, int64_t V) {
  LT_FLOAT_SWITCH(dtype, T, {
    if (log) LogSoftmaxBackwardT<T>(static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), N, V);
    else SoftmaxBackwardT<T>(static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), N, V);
  });
}

void CrossEntropyKernel(DType dtype, DType target_dtype, const void* x, const void* targets, int64_t ignore_index,
                        void* loss, void* lse, int64_t N, int64_t V) {
  LT_FLOAT_SWITCH(dtype, T,
                  LT_INDEX_SWITCH(target_dtype, I,
                                  CrossEntropyT<T, I>(static_cast<const T*>(x), static_cast<const I*>(targets),
                                                      ignore_index, static_cast<T*>(loss), static_cast<T*>(lse), N,
                                                      V)));
}

void CrossEntropyBackwardKernel(DType dtype, DType target_dtype, const void* x, const void* targets,
                                int64_t ignore_index, const void* lse, const void* dloss, void* dx, int64_t N,
                                int64_t V) {
  LT_FLOAT_SWITCH(dtype, T,
                  LT_INDEX_SWITCH(target_dtype, I,
                                  CrossEntropyBackwardT<T, I>(static_cast<const T*>(x), static_cast<const I*>(targets),
                                                              ignore_index, static_cast<const T*>(lse),
                                                              static_cast<const T*>(dloss), static_cast<T*>(dx), N,
                                                              V)));
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(SoftmaxKernel);
HWY_EXPORT(SoftmaxBackwardKernel);
HWY_EXPORT(CrossEntropyKernel);
HWY_EXPORT(CrossEntropyBackwardKernel);

namespace {

void softmax_rows(bool log, const Tensor& x, Tensor& y) {
  const int64_t V = x.dim(-1);
  HWY_DYNAMIC_DISPATCH(SoftmaxKernel)(x.dtype(), log, x.raw_data(), y.raw_data(), x.numel() / V, V);
}

void softmax_backward_rows(bool log, const Tensor& y, const Tensor& dy, Tensor& dx) {
  const int64_t V = y.dim(-1);
  HWY_DYNAMIC_DISPATCH(SoftmaxBackwardKernel)(y.dtype(), log, y.raw_data(), dy.raw_data(), dx.raw_data(),
                                              y.numel() / V, V);
}

}  // namespace

void softmax(const Tensor& x, Tensor& y) { softmax_rows(false, x, y); }
void log_softmax(const Tensor& x, Tensor& y) { softmax_rows(true, x, y); }
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) { softmax_backward_rows(false, y, dy, dx); }
void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) { softmax_backward_rows(true, y, dy, dx); }

void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss, Tensor& lse) {
  HWY_DYNAMIC_DISPATCH(CrossEntropyKernel)(logits.dtype(), targets.dtype(), logits.raw_data(), targets.raw_data(),
                                           ignore_index, loss.raw_data(), lse.raw_data(), targets.numel(),
                                           logits.dim(-1));
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse,
                            const Tensor& dloss, Tensor& dlogits) {
  HWY_DYNAMIC_DISPATCH(CrossEntropyBackwardKernel)(logits.dtype(), targets.dtype(), logits.raw_data(),
                                                   targets.raw_data(), ignore_index, lse.raw_data(), dloss.raw_data(),
                                                   dlogits.raw_data(), targets.numel(), logits.dim(-1));
}

void count_targets(const Tensor& targets, int64_t ignore_index, Tensor& count) {
  int64_t kept = 0;
  LT_INDEX_SWITCH(targets.dtype(), I, {
    const I* ids = targets.data<I>();
    for (int64_t n = 0; n < targets.numel(); ++n) kept += ids[n] != ignore_index;
  });
  *count.data<int64_t>() = kept;
}

// The sum, then one multiplication by 1 / count rounded to the dtype: the arithmetic of
// kernels::sum followed by kernels::scale, which the losses used before the count became a tensor.
void mean_over_count(const Tensor& values, const Tensor& count, Tensor& mean) {
  const int64_t kept = *count.data<int64_t>();
  if (kept == 0) return mean.zero_();
  sum(values, mean);
  axpby(1.0 / static_cast<double>(kept), mean, 0.0, mean);
}

void mean_over_count_backward(const Tensor& dmean, const Tensor& count, Tensor& dvalues) {
  const int64_t kept = *count.data<int64_t>();
  dvalues.fill_(kept == 0 ? 0.0 : dmean.item() / static_cast<double>(kept));
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
