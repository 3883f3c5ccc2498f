// Reduction CUDA kernels: the sum of all elements and of their squares, sums over the last dimension,
// and the mean of a loss over the targets that take part in it (count_targets, mean_over_count).
//
// Whole-tensor sums take two passes, neither with atomics: each block of the first pass adds a
// grid-stride share of the elements in f64 (block_sum, tensor/cuda/block_reduce.h) and writes one
// partial; one block then adds the partials in block order. The order is fixed by the size, so the
// result has the same bits every run. The CPU kernels (tensor/cpu/reduce.cc) add in the dtype across
// vector lanes, so the two backends agree to rounding, not bit for bit; the f64 partials here are the
// more accurate of the two.
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// Blocks of a first pass: enough to fill a GPU, few enough for the second pass to be one block.
constexpr int64_t kPartialBlocks = 1024;

struct Identity {
  template <class T>
  __device__ double operator()(T v) const {
    return static_cast<double>(v);
  }
};
struct Square {
  template <class T>
  __device__ double operator()(T v) const {
    return static_cast<double>(v) * static_cast<double>(v);
  }
};
// 1 for a target that takes part in the loss, 0 for an ignored one.
struct Counted {
  int64_t ignore_index;
  template <class I>
  __device__ double operator()(I id) const {
    return static_cast<int64_t>(id) == ignore_index ? 0.0 : 1.0;
  }
};

template <class Term, class T>
__global__ void partial_sums_kernel(const T* x, int64_t n, Term term, double* partial_N) {
  double local = 0;
  for (int64_t i = first_index(); i < n; i += grid_stride()) local += term(x[i]);
  const double block_total = block_sum(local);
  if (threadIdx.x == 0) partial_N[blockIdx.x] = block_total;
}

template <class Out>
__global__ void total_kernel(const double* partial_N, int64_t blocks, Out* out) {
  double local = 0;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) local += partial_N[b];
  const double total = block_sum(local);
  if (threadIdx.x == 0) out[0] = static_cast<Out>(total);
}

// out[0] = the sum of term(x[i]) over all n elements, rounded once to Out.
template <class Term, class T, class Out>
void sum_of_terms(const T* x, int64_t n, Term term, Out* out, Device device) {
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(blocks_for(n), kPartialBlocks));
  Tensor partial_N = Tensor::empty({blocks}, DType::F64, device);
  LT_CUDA_LAUNCH(static_cast<int>(blocks), kRowThreads, partial_sums_kernel<Term, T>)
  (x, n, term, partial_N.data<double>());
  LT_CUDA_LAUNCH(1, kRowThreads, total_kernel<Out>)(partial_N.data<double>(), blocks, out);
  LT_CUDA_CHECK(cudaGetLastError());
}

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
  LT_FLOAT_SWITCH(x.dtype(), T, sum_of_terms(x.data<T>(), x.numel(), Identity{}, out.data<T>(), x.device()));
}

void sum_squares(const Tensor& x, Tensor& out) {
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, sum_of_terms(x.data<T>(), x.numel(), Square{}, out.data<T>(), x.device()));
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
  LT_INDEX_SWITCH(
      targets.dtype(), I,
      sum_of_terms(targets.data<I>(), targets.numel(), Counted{ignore_index}, count.data<int64_t>(), targets.device()));
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
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, mean_over_count_backward_kernel<T>)
    (dmean.data<T>(), count.data<int64_t>(), dvalues.data<T>(), n);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
