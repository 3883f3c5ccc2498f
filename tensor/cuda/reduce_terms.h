// The reduction of many terms to one value on the device, shared by the kernels that reduce a whole
// tensor or routing (sums, sums of squares, target counts, the router's auxiliary sums, the largest
// logit). Two passes and no atomics: each block of the first pass reduces a grid-stride share of the
// terms in f64 (block_reduce, tensor/cuda/block_reduce.h) and writes one partial; one block then
// reduces the partials in block order. The order is fixed by the count, so the result has the same bits
// every run.
//
// A term is a functor of the term index returning a double, so a term can be an element, its square,
// a 0/1 indicator or a whole row's dot product.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"

namespace lt::LT_CUDA_NAMESPACE {

// Blocks of a first pass: enough to fill a GPU, few enough for the second pass to be one block.
inline constexpr int64_t kPartialBlocks = 1024;

template <class Term, class Op>
__global__ void reduce_terms_partial_kernel(int64_t n, Term term, Op op, double identity, double* partial_N) {
  double local = identity;
  for (int64_t i = first_index(); i < n; i += grid_stride()) local = op(local, term(i));
  const double block_total = block_reduce(local, op);
  if (threadIdx.x == 0) partial_N[blockIdx.x] = block_total;
}

template <class Op, class Out>
__global__ void reduce_terms_total_kernel(const double* partial_N, int64_t blocks, Op op, double identity, Out* out) {
  double local = identity;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) local = op(local, partial_N[b]);
  const double total = block_reduce(local, op);
  if (threadIdx.x == 0) out[0] = static_cast<Out>(total);
}

// out[0] = the reduction by `op` (SumOp or MaxOp) of term(0) .. term(n - 1), rounded once to Out;
// `identity` for n = 0.
template <class Term, class Op, class Out>
void reduce_terms(int64_t n, Term term, Op op, double identity, Out* out, Device device) {
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(blocks_for(n), kPartialBlocks));
  Tensor partial_N = Tensor::empty({blocks}, DType::F64, device);
  LT_CUDA_LAUNCH(static_cast<int>(blocks), kRowThreads, reduce_terms_partial_kernel<Term, Op>)(
      n, term, op, identity, partial_N.data<double>());
  LT_CUDA_LAUNCH(1, kRowThreads, reduce_terms_total_kernel<Op, Out>)(partial_N.data<double>(), blocks, op, identity,
                                                                     out);
  LT_CUDA_CHECK(cudaGetLastError());
}

template <class Term, class Out>
void sum_terms(int64_t n, Term term, Out* out, Device device) {
  reduce_terms(n, term, SumOp{}, 0.0, out, device);
}

}  // namespace lt::LT_CUDA_NAMESPACE
