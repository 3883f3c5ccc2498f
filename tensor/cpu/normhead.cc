// NormHead's column scale: inv_norm[j] = 1 / (sqrt(sum_v w[v, j]^2) + eps) for the head w [V, H].
//
// One pass over w with no [V, H] temporary. Squares are summed in f64 (a 126k-row vocabulary column in
// f32 would lose digits) per column in the chunked row order of tensor/column_sum_chunks.h, which the
// CUDA kernel shares (the same bits on both), so the result is independent of the thread count;
// threads split the columns in blocks, each of which walks every row.
#include <algorithm>
#include <cmath>

#include "tensor/column_sum_chunks.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

namespace lt::cpu {
namespace {

constexpr int64_t kColumnBlock = 64;  // one block's f64 sums stay in registers / L1

template <class T>
void ColumnInvNormT(const T* w, T* inv_norm, int64_t rows, int64_t cols, double eps) {
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  parallel_for(blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t block = block_begin; block < block_end; ++block) {
      const int64_t c0 = block * kColumnBlock, width = std::min(kColumnBlock, cols - c0);
      double totals[kColumnBlock] = {};
      for (int64_t r0 = 0; r0 < rows; r0 += kColumnSumChunkRows) {
        const int64_t r1 = std::min(rows, r0 + kColumnSumChunkRows);
        double sums[kColumnBlock] = {};
        for (int64_t r = r0; r < r1; ++r) {
          const T* row = w + r * cols + c0;
          for (int64_t j = 0; j < width; ++j) sums[j] += static_cast<double>(row[j]) * static_cast<double>(row[j]);
        }
        for (int64_t j = 0; j < width; ++j) totals[j] += sums[j];
      }
      for (int64_t j = 0; j < width; ++j) inv_norm[c0 + j] = static_cast<T>(1.0 / (std::sqrt(totals[j]) + eps));
    }
  });
}

}  // namespace

void column_inv_norm(const Tensor& w, double eps, Tensor& inv_norm) {
  LT_FLOAT_SWITCH(w.dtype(), T, ColumnInvNormT<T>(w.data<T>(), inv_norm.data<T>(), w.dim(0), w.dim(1), eps));
}

}  // namespace lt::cpu
