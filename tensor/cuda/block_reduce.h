// Reductions across the threads of a block, shared by the row kernels (one block per row): each thread
// brings its partial value, the block adds (or takes the maximum of) them in a tree in shared memory,
// in an order fixed by the thread index, so the result has the same bits run after run. Partials are
// f64, as the row statistics of the CPU kernels are.
#pragma once
#include "tensor/cuda/kernels.h"

namespace lt::LT_CUDA_NAMESPACE {

inline constexpr int kRowThreads = 256;  // the block size of every row kernel

struct SumOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};
struct MaxOp {
  __device__ double operator()(double a, double b) const { return a > b ? a : b; }
};
struct MinOp {
  __device__ double operator()(double a, double b) const { return a < b ? a : b; }
};

// The reduction of every thread's `v` over the block (of kRowThreads threads), returned to all of them.
template <class Op>
__device__ inline double block_reduce(double v, Op op) {
  __shared__ double partial[kRowThreads];
  const int t = static_cast<int>(threadIdx.x);
  partial[t] = v;
  __syncthreads();
  for (int half = kRowThreads / 2; half > 0; half /= 2) {
    if (t < half) partial[t] = op(partial[t], partial[t + half]);
    __syncthreads();
  }
  const double result = partial[0];
  __syncthreads();  // every thread has read the result before a next call writes the tile
  return result;
}

__device__ inline double block_sum(double v) { return block_reduce(v, SumOp{}); }
__device__ inline double block_max(double v) { return block_reduce(v, MaxOp{}); }

}  // namespace lt::LT_CUDA_NAMESPACE
