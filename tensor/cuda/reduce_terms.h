// The reduction of many terms to one value on the device, shared by the kernels that reduce a whole
// tensor or routing (sums, sums of squares, target counts, the router's auxiliary sums, the largest
// logit). One launch and no floating-point atomics: each block reduces a grid-stride share of the terms
// in f64 (block_reduce, tensor/cuda/block_reduce.h) and writes one partial; the last block to finish
// (tensor/cuda/last_block.h) reduces the partials in block order. The order is fixed by the count, so
// the result has the same bits every run.
//
// A term is a functor of the term index returning a double, so a term can be an element, its square,
// a 0/1 indicator or a whole row's dot product. Kernels that need several reductions of one routing
// run them in one launch from the pieces below (tensor/cuda/moe_stats.cu): each reduction keeps the
// blocks and order that reduce_terms gives it, so its bits do not depend on what shares the launch.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/last_block.h"

namespace lt::LT_CUDA_NAMESPACE {

// Blocks of a reduction of n terms: enough to fill a GPU, few enough for the last block to reduce their
// partials in one pass.
inline constexpr int64_t kPartialBlocks = 1024;
inline int64_t partial_blocks(int64_t n) {
  return std::max<int64_t>(1, std::min<int64_t>(blocks_for(n), kPartialBlocks));
}

// Block blockIdx.x's partial of a reduction of n terms over `blocks` blocks (its grid-stride share,
// kRowThreads threads a block) into partial_B[blockIdx.x]; a block of a larger grid beyond `blocks` has
// no share. Every thread of the block calls it.
template <class Term, class Op>
__device__ inline void write_block_partial(int64_t n, int64_t blocks, Term term, Op op, double identity,
                                           double* partial_B) {
  if (blockIdx.x >= blocks) return;  // the same for every thread of the block
  double local = identity;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += blocks * blockDim.x)
    local = op(local, term(i));
  const double block_total = block_reduce(local, op);
  if (threadIdx.x == 0) partial_B[blockIdx.x] = block_total;
}

// The reduction of partial_B [blocks] in block order, on every thread of the last block to finish.
template <class Op>
__device__ inline double total_of_partials(const double* partial_B, int64_t blocks, Op op, double identity) {
  const volatile double* partial = written_by_other_blocks(partial_B);
  double local = identity;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) local = op(local, partial[b]);
  return block_reduce(local, op);
}

template <class Term, class Op, class Out>
__global__ void reduce_terms_kernel(int64_t n, Term term, Op op, double identity, double* partial_B, Out* out) {
  write_block_partial(n, gridDim.x, term, op, identity, partial_B);
  if (!last_block_to_finish()) return;
  const double total = total_of_partials(partial_B, gridDim.x, op, identity);
  if (threadIdx.x == 0) out[0] = static_cast<Out>(total);
}

// out[0] = the reduction by `op` (SumOp or MaxOp) of term(0) .. term(n - 1), rounded once to Out;
// `identity` for n = 0.
template <class Term, class Op, class Out>
void reduce_terms(int64_t n, Term term, Op op, double identity, Out* out, Device device) {
  const int64_t blocks = partial_blocks(n);
  Tensor partial_B = Tensor::empty({blocks}, DType::F64, device);
  LT_CUDA_LAUNCH(static_cast<int>(blocks), kRowThreads, reduce_terms_kernel<Term, Op, Out>)(
      n, term, op, identity, partial_B.data<double>(), out);
  LT_CUDA_CHECK(cudaGetLastError());
}

template <class Term, class Out>
void sum_terms(int64_t n, Term term, Out* out, Device device) {
  reduce_terms(n, term, SumOp{}, 0.0, out, device);
}

}  // namespace lt::LT_CUDA_NAMESPACE
