// Reduction CUDA kernels: the sum of all elements and of their squares, sums over the last dimension,
// and the mean of a loss over the targets that take part in it (count_targets, mean_over_count).
//
// Whole-tensor sums are reduce_terms (tensor/cuda/reduce_terms.h): f64 partials per block, then one
// block adds them in order, so the result has the same bits every run. The CPU kernels (tensor/cpu/reduce.cc) add in the dtype across
// vector lanes, so the two backends agree to rounding, not bit for bit; the f64 partials here are the
// more accurate of the two.
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/reduce_terms.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// The terms of the sums.
template <class T>
struct ElementOf {
  const T* x;
  __device__ double operator()(int64_t i) const { return static_cast<double>(x[i]); }
};
template <class T>
struct SquareOf {
  const T* x;
  __device__ double operator()(int64_t i) const { return static_cast<double>(x[i]) * static_cast<double>(x[i]); }
};
// 1 for a target that takes part in the loss, 0 for an ignored one.
template <class I>
struct CountedTarget {
  const I* ids;
  int64_t ignore_index;
  __device__ double operator()(int64_t i) const { return static_cast<int64_t>(ids[i]) == ignore_index ? 0.0 : 1.0; }
};

template <class T>
__global__ void sum_last_dim_kernel(const T* x_NC, T* out_N, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    double local = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) local += static_cast<double>(x_NC[n * C + j]);
    const double total = block_sum(local);
    if (threadIdx.x == 0) out_N[n] = static_cast<T>(total);
  }
}

// mean = sum * (1 / count) with the factor rounded to T, as the CPU kernel scales; 0 for no targets.
template <class T>
__global__ void divide_by_count_kernel(T* mean, const int64_t* count) {
  const int64_t kept = count[0];
  mean[0] = kept == 0 ? T(0) : static_cast<T>(1.0 / static_cast<double>(kept)) * mean[0];
}

template <class T>
__global__ void mean_over_count_backward_kernel(const T* dmean, const int64_t* count, T* dvalues, int64_t n) {
  const int64_t kept = count[0];
  const T value = kept == 0 ? T(0) : static_cast<T>(static_cast<double>(dmean[0]) / static_cast<double>(kept));
  for (int64_t i = first_index(); i < n; i += grid_stride()) dvalues[i] = value;
}

}  // namespace

void sum(const Tensor& x, Tensor& out) {
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, sum_terms(x.numel(), ElementOf<T>{x.data<T>()}, out.data<T>(), x.device()));
}

void sum_squares(const Tensor& x, Tensor& out) {
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, sum_terms(x.numel(), SquareOf<T>{x.data<T>()}, out.data<T>(), x.device()));
}

void sum_last_dim(const Tensor& x, Tensor& out) {
  const int64_t C = x.dim(-1), N = out.numel();
  if (N == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, sum_last_dim_kernel<T>)(x.data<T>(), out.data<T>(), N, C));
  LT_CUDA_CHECK(cudaGetLastError());
}

void count_targets(const Tensor& targets, int64_t ignore_index, Tensor& count) {
  const DeviceGuard guard(targets.device().index);
  LT_INDEX_SWITCH(targets.dtype(), I,
                  sum_terms(targets.numel(), CountedTarget<I>{targets.data<I>(), ignore_index},
                            count.data<int64_t>(), targets.device()));
}

void mean_over_count(const Tensor& values, const Tensor& count, Tensor& mean) {
  sum(values, mean);
  const DeviceGuard guard(values.device().index);
  LT_FLOAT_SWITCH(values.dtype(), T,
                  LT_CUDA_LAUNCH(1, 1, divide_by_count_kernel<T>)(mean.data<T>(), count.data<int64_t>()));
  LT_CUDA_CHECK(cudaGetLastError());
}

void mean_over_count_backward(const Tensor& dmean, const Tensor& count, Tensor& dvalues) {
  const int64_t n = dvalues.numel();
  if (n == 0) return;
  const DeviceGuard guard(dmean.device().index);
  LT_FLOAT_SWITCH(dmean.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, mean_over_count_backward_kernel<T>)(
        dmean.data<T>(), count.data<int64_t>(), dvalues.data<T>(), n);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
