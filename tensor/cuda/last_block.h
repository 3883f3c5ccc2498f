// The last block of a launch to finish, for kernels that do in one launch what would otherwise take
// two: every block writes its share of the work (a partial sum, counts of a chunk) to device memory,
// and the block that finishes last reads all the shares and completes the work. An integer ticket tells
// it that it is last; nothing adds floating-point values atomically. Which block is last varies from
// run to run, what it computes does not: it reads the shares in a fixed order, so the results have the
// same bits every run.
//
// The ticket is one counter per device and translation unit (a __device__ variable, zero when the
// module loads). Every launch leaves it at zero: atomicInc wraps it back as the grid's last block takes
// its ticket. The launches of one stream run one after another and every kernel here runs on the
// default stream (tensor/cuda/kernels.h), so no two launches take tickets at once.
#pragma once
#include "tensor/cuda/kernels.h"

namespace lt::LT_CUDA_NAMESPACE {

static __device__ unsigned int finished_blocks = 0;

// True on every thread of the block that finishes the launch (a one-dimensional grid) last. Every thread
// of every block calls it, after its last write that the last block reads; the last block then reads
// the other blocks' writes through written_by_other_blocks.
__device__ inline bool last_block_to_finish() {
  __shared__ bool last;
  __threadfence();  // this thread's writes are seen device-wide before its block takes a ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicInc(&finished_blocks, gridDim.x - 1) == gridDim.x - 1;
  __syncthreads();
  return last;
}

// A volatile view of memory that other blocks of the launch wrote: its loads bypass this multiprocessor's
// L1 cache, which does not see other multiprocessors' writes.
template <class T>
__device__ inline const volatile T* written_by_other_blocks(const T* p) {
  return p;
}
template <class T>
__device__ inline volatile T* written_by_other_blocks(T* p) {
  return p;
}

}  // namespace lt::LT_CUDA_NAMESPACE
