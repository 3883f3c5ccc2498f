// Sums over the rows of a matrix, per column, on the device: NormHead's column norms (normhead.cu),
// RMSNorm's weight gradient (norm.cu) and sum_to (elementwise.cu). Two passes and no atomics, in the
// order of tensor/column_sum_chunks.h that the CPU kernels share:
//   1. a block per (tile of kColumnTile columns, chunk of kColumnSumChunkRows rows): each thread adds its
//      column's rows of the chunk in order, into partial [chunks, cols]; consecutive threads read
//      consecutive columns of a row, so every row of the tile is one coalesced read;
//   2. a thread per column adds its partials in chunk order and hands the total to the kernel's finish
//      (a square root, a write, an addition into the output).
// With one chunk (rows <= kColumnSumChunkRows) the first pass finishes itself: one launch, no buffer.
// The partial buffer comes from the caching allocator, so steady-state steps allocate nothing from the
// driver.
//
// `accumulate(sum, r, j)` returns sum plus the term of row r, column j (the kernel decides how it
// rounds: a plain add, or a product rounded before the add as the CPU's loops compute it);
// `finish(j, total)` writes column j.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/column_sum_chunks.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"

namespace lt::LT_CUDA_NAMESPACE {

inline constexpr int kColumnTile = 128;  // columns per block of the first pass

template <class Acc, bool kFinish, class Accumulate, class Finish>
__global__ void column_chunk_sums_kernel(int64_t rows, int64_t cols, Accumulate accumulate, Finish finish,
                                         Acc* partial_KC) {
  const int64_t chunks = kFinish ? 1 : column_sum_chunks(rows);
  for (int64_t c = blockIdx.y; c < chunks; c += gridDim.y)
    for (int64_t j = first_index(); j < cols; j += grid_stride()) {
      const int64_t begin = c * kColumnSumChunkRows;
      const int64_t end = begin + kColumnSumChunkRows < rows ? begin + kColumnSumChunkRows : rows;
      Acc sum = 0;
      for (int64_t r = begin; r < end; ++r) sum = accumulate(sum, r, j);
      if constexpr (kFinish)
        finish(j, Acc(0) + sum);  // the second pass's total of one chunk, bit for bit
      else
        partial_KC[c * cols + j] = sum;
    }
}

template <class Acc, class Finish>
__global__ void column_chunk_totals_kernel(const Acc* partial_KC, int64_t chunks, int64_t cols, Finish finish) {
  for (int64_t j = first_index(); j < cols; j += grid_stride()) {
    Acc total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += partial_KC[c * cols + j];
    finish(j, total);
  }
}

template <class Acc, class Accumulate, class Finish>
void column_sums(int64_t rows, int64_t cols, Accumulate accumulate, Finish finish, Device device) {
  if (cols == 0) return;
  const int64_t chunks = column_sum_chunks(rows);
  const unsigned tiles = static_cast<unsigned>(std::min<int64_t>((cols + kColumnTile - 1) / kColumnTile, kMaxBlocks));
  if (chunks <= 1) {
    LT_CUDA_LAUNCH(dim3(tiles), kColumnTile, column_chunk_sums_kernel<Acc, true, Accumulate, Finish>)(
        rows, cols, accumulate, finish, static_cast<Acc*>(nullptr));
  } else {
    Tensor partial_KC = Tensor::empty({chunks, cols}, dtype_of<Acc>(), device);
    const dim3 grid(tiles, static_cast<unsigned>(std::min(chunks, kMaxGridY)));
    LT_CUDA_LAUNCH(grid, kColumnTile, column_chunk_sums_kernel<Acc, false, Accumulate, Finish>)(
        rows, cols, accumulate, finish, partial_KC.data<Acc>());
    LT_CUDA_LAUNCH(blocks_for(cols), kThreadsPerBlock, column_chunk_totals_kernel<Acc, Finish>)(
        partial_KC.data<Acc>(), chunks, cols, finish);
  }
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
