// The one kernel of the NCCL communicator (dist/nccl_communicator.cpp): the rank-order sum of the parts
// a rank received, the CUDA twin of sum_in_rank_order in dist/communicator.cpp. The .cu files of a layer
// are compiled whenever CUDA is, with or without NCCL, hence the guard.
#ifdef LINGTRAIN_NCCL
#include <algorithm>
#include <cstdint>

#include "dist/communicator.h"
#include "tensor/cuda/cuda_runtime.h"

namespace lt {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill the largest GPUs many times over; beyond this, threads loop instead.
constexpr int64_t kMaxBlocks = 8192;

// One thread per element, a grid-stride loop. The additions are the CPU loop's, in the same dtype and
// the same order (part 0, then + part 1, + part 2, ...), then one product for a mean: nothing that
// nvcc could contract into an FMA, so the bytes equal the MPI communicator's.
template <class T>
__global__ void sum_in_rank_order_kernel(const T* parts, int ranks, int64_t n, bool mean, T inverse_ranks, T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    T total = parts[i];
    for (int r = 1; r < ranks; ++r) total += parts[static_cast<int64_t>(r) * n + i];
    out[i] = mean ? total * inverse_ranks : total;
  }
}

template <class T>
void launch(const void* parts, int ranks, int64_t n, ReduceOp op, void* out) {
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks));
  // 1 / ranks rounded once to T, as the CPU loop does, rather than a division per element.
  sum_in_rank_order_kernel<<<blocks, kThreadsPerBlock>>>(static_cast<const T*>(parts), ranks, n, op == ReduceOp::Mean,
                                                         static_cast<T>(1.0 / ranks), static_cast<T*>(out));
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void sum_in_rank_order_cuda(DType dtype, const void* parts, int ranks, int64_t n, ReduceOp op, void* out) {
  if (n == 0) return;
  if (dtype == DType::F32) launch<float>(parts, ranks, n, op, out);
  else launch<double>(parts, ranks, n, op, out);
}

}  // namespace lt
#endif  // LINGTRAIN_NCCL
