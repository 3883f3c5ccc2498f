// Launch geometry shared by the CUDA kernel files: one-dimensional grid-stride loops, in which a grid
// sized to the data (up to a cap) walks the range in steps of the whole grid.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/cuda/kernels.h"

namespace lt::LT_CUDA_NAMESPACE {

inline constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill the largest GPUs many times over; beyond this, threads loop instead.
inline constexpr int64_t kMaxBlocks = 8192;
// The most blocks a grid's y dimension takes (CUDA's limit); beyond this, blocks loop.
inline constexpr int64_t kMaxGridY = 65535;

inline int blocks_for(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxBlocks));
}

// Row kernels: one block per row, up to the cap (blocks then loop over rows).
inline int row_blocks(int64_t rows) { return static_cast<int>(std::min<int64_t>(rows, kMaxBlocks)); }

__device__ inline int64_t first_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace lt::LT_CUDA_NAMESPACE
