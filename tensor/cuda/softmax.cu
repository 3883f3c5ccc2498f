// Softmax and log-softmax CUDA kernels over the last dimension, forward and backward, with the CPU
// kernels' numerics (tensor/cpu/softmax.cc): each row is shifted by its maximum before exp, so exp
// never overflows; row sums accumulate in f64; log-softmax is (x - max) - log(sum), exact near the
// maximum. Cross-entropy (with ignore index) is the log-softmax of the target only, with the same row
// statistics; its targets were checked on the device by the front door. One block per row, its threads striding over
// the row; the sums and the maximum come from block_reduce (tensor/cuda/block_reduce.h), so the results are
// deterministic without atomics.
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// The row's maximum and sum of exp(x - max), on every thread of the block.
template <class T>
__device__ inline void row_max_and_sum(const T* x, int64_t V, T& max, double& sum) {
  double local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    local_max = local_max > x[j] ? local_max : static_cast<double>(x[j]);
  max = static_cast<T>(block_max(local_max));
  double local_sum = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) local_sum += static_cast<double>(exponential(x[j] - max));
  sum = block_sum(local_sum);
}

template <class T>
__global__ void softmax_kernel(const T* x_NV, T* y_NV, int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = x_NV + n * V;
    T max;
    double sum;
    row_max_and_sum(x, V, max, sum);
    const T inv_sum = static_cast<T>(1.0 / sum);
    T* y = y_NV + n * V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) y[j] = exponential(x[j] - max) * inv_sum;
  }
}

template <class T>
__global__ void log_softmax_kernel(const T* x_NV, T* y_NV, int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = x_NV + n * V;
    T max;
    double sum;
    row_max_and_sum(x, V, max, sum);
    const T log_sum = static_cast<T>(log(sum));
    T* y = y_NV + n * V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) y[j] = (x[j] - max) - log_sum;
  }
}

// dx = y (dy - sum(y dy)).
template <class T>
__global__ void softmax_backward_kernel(const T* y_NV, const T* dy_NV, T* dx_NV, int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* y = y_NV + n * V;
    const T* dy = dy_NV + n * V;
    double local = 0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) local += static_cast<double>(y[j] * dy[j]);
    const T dot = static_cast<T>(block_sum(local));
    T* dx = dx_NV + n * V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = y[j] * (dy[j] - dot);
  }
}

// dx = dy - exp(y) sum(dy), y the log-probabilities.
template <class T>
__global__ void log_softmax_backward_kernel(const T* y_NV, const T* dy_NV, T* dx_NV, int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* y = y_NV + n * V;
    const T* dy = dy_NV + n * V;
    double local = 0;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) local += static_cast<double>(dy[j]);
    const T dy_sum = static_cast<T>(block_sum(local));
    T* dx = dx_NV + n * V;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dx[j] = dy[j] - exponential(y[j]) * dy_sum;
  }
}

// loss = (max - x[target]) + log(sum exp(x - max)) in f64, lse rounded to T only when stored, as on
// the CPU; 0 for an ignored target (whose lse is still kept).
template <class T, class I>
__global__ void cross_entropy_kernel(const T* x_NV, const I* target_N, int64_t ignore_index, T* loss_N, T* lse_N,
                                     int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = x_NV + n * V;
    T max;
    double sum;
    row_max_and_sum(x, V, max, sum);
    if (threadIdx.x == 0) {
      const double log_sum = log(sum);
      lse_N[n] = static_cast<T>(static_cast<double>(max) + log_sum);
      const int64_t target = static_cast<int64_t>(target_N[n]);
      loss_N[n] = target == ignore_index
                      ? T(0)
                      : static_cast<T>(static_cast<double>(max) - static_cast<double>(x[target]) + log_sum);
    }
  }
}

// dx = dloss (exp(x - lse) - onehot(target)); zero rows where the target is ignored. The thread that
// owns the target's column subtracts, so no element is written twice.
template <class T, class I>
__global__ void cross_entropy_backward_kernel(const T* x_NV, const I* target_N, int64_t ignore_index, const T* lse_N,
                                              const T* dloss_N, T* dx_NV, int64_t N, int64_t V) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = x_NV + n * V;
    T* dx = dx_NV + n * V;
    const int64_t target = static_cast<int64_t>(target_N[n]);
    const bool ignored = target == ignore_index;
    const T lse = lse_N[n], dloss = dloss_N[n];
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      if (ignored) {
        dx[j] = T(0);
        continue;
      }
      const T grad = dloss * exponential(x[j] - lse);
      dx[j] = j == target ? grad - dloss : grad;
    }
  }
}

// Rows of the last dimension: (N, V).
struct Rows {
  int64_t N, V;
};
Rows rows_of(const Tensor& t) { return {t.numel() / t.dim(-1), t.dim(-1)}; }

}  // namespace

void softmax(const Tensor& x, Tensor& y) {
  const auto [N, V] = rows_of(x);
  if (N == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, softmax_kernel<T>)(x.data<T>(), y.data<T>(), N, V));
  LT_CUDA_CHECK(cudaGetLastError());
}

void log_softmax(const Tensor& x, Tensor& y) {
  const auto [N, V] = rows_of(x);
  if (N == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, log_softmax_kernel<T>)(x.data<T>(), y.data<T>(), N, V));
  LT_CUDA_CHECK(cudaGetLastError());
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const auto [N, V] = rows_of(y);
  if (N == 0) return;
  const DeviceGuard guard(y.device().index);
  LT_FLOAT_SWITCH(y.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, softmax_backward_kernel<T>)(y.data<T>(), dy.data<T>(),
                                                                                         dx.data<T>(), N, V));
  LT_CUDA_CHECK(cudaGetLastError());
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const auto [N, V] = rows_of(y);
  if (N == 0) return;
  const DeviceGuard guard(y.device().index);
  LT_FLOAT_SWITCH(y.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, log_softmax_backward_kernel<T>)(y.data<T>(), dy.data<T>(),
                                                                                             dx.data<T>(), N, V));
  LT_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss, Tensor& lse) {
  const auto [N, V] = rows_of(logits);
  if (N == 0) return;
  const DeviceGuard guard(logits.device().index);
  LT_FLOAT_SWITCH(logits.dtype(), T, LT_INDEX_SWITCH(targets.dtype(), I, {
                    LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, cross_entropy_kernel<T, I>)(
                        logits.data<T>(), targets.data<I>(), ignore_index, loss.data<T>(), lse.data<T>(), N, V);
                  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse,
                            const Tensor& dloss, Tensor& dlogits) {
  const auto [N, V] = rows_of(logits);
  if (N == 0) return;
  const DeviceGuard guard(logits.device().index);
  LT_FLOAT_SWITCH(logits.dtype(), T, LT_INDEX_SWITCH(targets.dtype(), I, {
                    LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, cross_entropy_backward_kernel<T, I>)(
                        logits.data<T>(), targets.data<I>(), ignore_index, lse.data<T>(), dloss.data<T>(),
                     dlogits.data<T>(), N, V);
                  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
