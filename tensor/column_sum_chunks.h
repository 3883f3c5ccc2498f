// The order of additions of the column sums (per column, a sum over all rows) that the CPU kernels
// (tensor/cpu/elementwise.cc's sum_to, tensor/cpu/normhead.cc) and their CUDA kernels
// (tensor/cuda/column_sums.h) share, so that both backends give the same bits: the rows in chunks of
// kColumnSumChunkRows, each chunk summed in row order from zero, then the chunk sums added in chunk order
// from zero. On a GPU the chunks are the blocks of a first pass, so the chunk size is fixed here (not by
// the GPU's size): the same bits on every GPU, run after run.
#pragma once
#include <cstdint>

#include "tensor/host_device.h"

namespace lt {

// 64 rows: a [2048, 8192] sum is 32 chunks x 64 column tiles of blocks, enough to fill a large GPU, and a
// second pass of 32 additions per column.
inline constexpr int64_t kColumnSumChunkRows = 64;

LT_HOST_DEVICE inline int64_t column_sum_chunks(int64_t rows) {
  return (rows + kColumnSumChunkRows - 1) / kColumnSumChunkRows;
}

}  // namespace lt
