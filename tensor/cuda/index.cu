// Indexing CUDA kernels: the device-side range check of index tensors, row gather / scatter-add
// (embedding lookup and its backward, MoE dispatch), top-k per row, and per-row column gather /
// scatter-add, with the CPU kernels' results (tensor/cpu/index.cc).
//
// Determinism without atomics: scatter_add_rows (the embedding backward) is a sorted segment reduction.
// The source rows are put in a stable order by output row (a comparison sort: each block of kSortChunk
// positions ranks its own, then each position adds, chunk by chunk, how many of the other chunks'
// positions come before it, found by binary search), and one block per output row adds its segment to
// it in source order, its threads over a tile of columns. So every output element receives its contributions
// in row order, exactly as on the CPU, with the parallelism of rows times columns and no dependence on
// the size of the output table. scatter_add_cols gives each thread one row, which only touches its own
// output row.
#include <algorithm>
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/reduce_terms.h"
#include "tensor/dtype_switch.h"
#include "tensor/topk_row.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// Positions travel through the block reductions (reduce_terms) as doubles: exact below 2^53 elements.
constexpr double kNoPosition = 1e300;

// The term of the range check: the position of a disallowed id, kNoPosition for an allowed one; their
// minimum is the first bad position.
template <class I>
struct BadPosition {
  const I* ids;
  IndexRange range;
  __device__ double operator()(int64_t i) const {
    const int64_t id = static_cast<int64_t>(ids[i]);
    const bool allowed = (id >= 0 && id < range.bound) || (range.has_ignored && id == range.ignored);
    return allowed ? kNoPosition : static_cast<double>(i);
  }
};

template <class I>
__global__ void out_of_range_result_kernel(const I* ids, const double* first, int64_t* result) {
  const int64_t position = first[0] == kNoPosition ? -1 : static_cast<int64_t>(first[0]);
  result[0] = position;
  result[1] = position < 0 ? 0 : static_cast<int64_t>(ids[position]);
}

template <class T, class I>
__global__ void gather_rows_kernel(const T* table, const I* idx, T* out, int64_t n, int64_t cols) {
  for (int64_t i = first_index(); i < n * cols; i += grid_stride())
    out[i] = table[static_cast<int64_t>(idx[i / cols]) * cols + i % cols];
}

// The same gather into bf16 rows of an f32 table, rounded to nearest even as round_to_bf16 rounds, or of
// a bf16 one (K: kept_value, whose widened values round back to themselves).
template <class K, class I>
__global__ void gather_rows_to_bf16_kernel(const K* table, const I* idx, uint16_t* out, int64_t n, int64_t cols) {
  for (int64_t i = first_index(); i < n * cols; i += grid_stride())
    out[i] = f32_to_bf16(kept_value<float>(table, static_cast<int64_t>(idx[i / cols]) * cols + i % cols));
}

// The positions of scatter_add_rows' sort, ranked a block at a time: one thread per position.
constexpr int64_t kSortChunk = kThreadsPerBlock;

// Whether source position (row_a, a) comes before (row_b, b): by output row, then by position.
__device__ inline bool sorts_before(int64_t row_a, int64_t a, int64_t row_b, int64_t b) {
  return row_a < row_b || (row_a == row_b && a < b);
}

// Block c sorts positions [c kSortChunk, ...): chunk_rows_N and chunk_order_N hold each chunk's output
// rows and positions in sorted order, chunk_rank_N each position's rank within its chunk. With one chunk,
// that is the whole sort.
template <class I>
__global__ void sort_chunks_kernel(const I* idx_N, int64_t n, int64_t* chunk_rows_N, int64_t* chunk_order_N,
                                   int64_t* chunk_rank_N) {
  __shared__ int64_t rows[kSortChunk];
  const int64_t chunks = (n + kSortChunk - 1) / kSortChunk, t = threadIdx.x;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t begin = c * kSortChunk, size = n - begin < kSortChunk ? n - begin : kSortChunk;
    if (t < size) rows[t] = static_cast<int64_t>(idx_N[begin + t]);
    __syncthreads();
    if (t < size) {
      int64_t rank = 0;
      for (int64_t u = 0; u < size; ++u) rank += sorts_before(rows[u], u, rows[t], t) ? 1 : 0;
      chunk_rows_N[begin + rank] = rows[t];
      chunk_order_N[begin + rank] = begin + t;
      chunk_rank_N[begin + t] = rank;
    }
    __syncthreads();  // every thread has read the tile before the next chunk writes it
  }
}

// Position i's rank in the whole sort: its rank in its chunk plus, for every other chunk, the count of
// that chunk's positions that come before it (an earlier chunk's equal rows do, a later chunk's do not).
template <class I>
__global__ void place_sorted_kernel(const I* idx_N, const int64_t* chunk_rows_N, const int64_t* chunk_rank_N,
                                    int64_t n, int64_t* order_N, int64_t* sorted_rows_N) {
  const int64_t chunks = (n + kSortChunk - 1) / kSortChunk;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t row = static_cast<int64_t>(idx_N[i]), own = i / kSortChunk;
    int64_t rank = chunk_rank_N[i];
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == own) continue;
      const int64_t* sorted = chunk_rows_N + c * kSortChunk;
      int64_t lo = 0, hi = n - c * kSortChunk < kSortChunk ? n - c * kSortChunk : kSortChunk;
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (sorted[mid] < row || (c < own && sorted[mid] == row))
          lo = mid + 1;
        else
          hi = mid;
      }
      rank += lo;
    }
    order_N[rank] = i;
    sorted_rows_N[rank] = row;
  }
}

// The blocks at the start of each segment of equal rows (one per tile of columns, so that a frequent
// row's long segment is shared out) add the segment's source rows to that output row, in source order;
// the other blocks have nothing to do.
template <class T>
__global__ void add_segments_kernel(const T* src, const int64_t* order_N, const int64_t* sorted_rows_N, int64_t n,
                                    int64_t cols, T* out) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int64_t row = sorted_rows_N[k];
    if (k > 0 && sorted_rows_N[k - 1] == row) continue;
    int64_t end = k + 1;
    while (end < n && sorted_rows_N[end] == row) ++end;
    for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < cols;
         j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      T total = out[row * cols + j];
      for (int64_t s = k; s < end; ++s) total += src[order_N[s] * cols + j];
      out[row * cols + j] = total;
    }
  }
}

template <class T>
__global__ void topk_kernel(const T* x, T* values, int32_t* indices, int64_t rows, int64_t cols, int64_t k) {
  for (int64_t r = first_index(); r < rows; r += grid_stride())
    TopKRow(x + r * cols, cols, k, values + r * k, indices + r * k);
}

template <class T, class I>
__global__ void gather_cols_kernel(const T* x, const I* idx, T* out, int64_t rows, int64_t cols, int64_t k) {
  for (int64_t i = first_index(); i < rows * k; i += grid_stride())
    out[i] = x[(i / k) * cols + static_cast<int64_t>(idx[i])];
}

template <class T, class I>
__global__ void scatter_add_cols_kernel(const T* dout, const I* idx, T* dx, int64_t rows, int64_t cols, int64_t k) {
  for (int64_t r = first_index(); r < rows; r += grid_stride())
    for (int64_t j = 0; j < k; ++j) dx[r * cols + static_cast<int64_t>(idx[r * k + j])] += dout[r * k + j];
}

}  // namespace

OutOfRange first_out_of_range(const Tensor& ids, const IndexRange& range) {
  const int64_t n = ids.numel();
  if (n == 0) return {};
  const DeviceGuard guard(ids.device().index);
  Tensor first = Tensor::empty({1}, DType::F64, ids.device());
  Tensor result = Tensor::empty({2}, DType::I64, ids.device());
  LT_INDEX_SWITCH(ids.dtype(), I, {
    reduce_terms(n, BadPosition<I>{ids.data<I>(), range}, MinOp{}, kNoPosition, first.data<double>(), ids.device());
    LT_CUDA_LAUNCH(1, 1, out_of_range_result_kernel<I>)(ids.data<I>(), first.data<double>(), result.data<int64_t>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
  const Tensor host = result.to(Device::cpu());
  return {host.data<int64_t>()[0], host.data<int64_t>()[1]};
}

void gather_rows(const Tensor& table, const Tensor& idx, Tensor& out) {
  const int64_t n = idx.numel(), cols = table.dim(1);
  if (n * cols == 0) return;
  const DeviceGuard guard(table.device().index);
  if (out.dtype() == DType::BF16) {
    LT_KEPT_SWITCH(table, float, K, LT_INDEX_SWITCH(idx.dtype(), I, {
                     LT_CUDA_LAUNCH(blocks_for(n * cols), kThreadsPerBlock, gather_rows_to_bf16_kernel<K, I>)(
                         static_cast<const K*>(table.raw_data()), idx.data<I>(),
                         static_cast<uint16_t*>(out.raw_data()), n, cols);
                   }));
    LT_CUDA_CHECK(cudaGetLastError());
    return;
  }
  LT_FLOAT_SWITCH(table.dtype(), T, LT_INDEX_SWITCH(idx.dtype(), I, {
                    LT_CUDA_LAUNCH(blocks_for(n * cols), kThreadsPerBlock, gather_rows_kernel<T, I>)(
                        table.data<T>(), idx.data<I>(), out.data<T>(), n, cols);
                  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& out) {
  const int64_t n = idx.numel(), cols = out.dim(1);
  if (n * cols == 0) return;
  const DeviceGuard guard(src.device().index);
  // One buffer from the caching allocator: each chunk's sorted rows and positions, the ranks in the
  // chunks, then the order of the source rows and their output rows in that order.
  const int64_t chunks = (n + kSortChunk - 1) / kSortChunk;
  Tensor sort_5N = Tensor::empty({5, n}, DType::I64, src.device());
  int64_t* chunk_rows = sort_5N.data<int64_t>();
  int64_t *chunk_order = chunk_rows + n, *chunk_rank = chunk_rows + 2 * n;
  int64_t *order = chunk_order, *sorted_rows = chunk_rows;
  LT_INDEX_SWITCH(idx.dtype(), I, {
    LT_CUDA_LAUNCH(row_blocks(chunks), kSortChunk, sort_chunks_kernel<I>)(idx.data<I>(), n, chunk_rows, chunk_order,
                                                                         chunk_rank);
    if (chunks > 1) {
      order = chunk_rows + 3 * n;
      sorted_rows = chunk_rows + 4 * n;
      LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, place_sorted_kernel<I>)(idx.data<I>(), chunk_rows, chunk_rank, n,
                                                                             order, sorted_rows);
    }
  });
  LT_FLOAT_SWITCH(src.dtype(), T, {
    const int64_t tiles = std::min<int64_t>((cols + kThreadsPerBlock - 1) / kThreadsPerBlock, kMaxGridY);
    const dim3 grid(static_cast<unsigned>(row_blocks(n)), static_cast<unsigned>(tiles));
    LT_CUDA_LAUNCH(grid, kThreadsPerBlock, add_segments_kernel<T>)(src.data<T>(), order, sorted_rows, n, cols,
                                                                  out.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void topk(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  if (rows == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(rows), kThreadsPerBlock, topk_kernel<T>)(
        x.data<T>(), values.data<T>(), indices.data<int32_t>(), rows, cols, k);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void gather_cols(const Tensor& x, const Tensor& idx, Tensor& out) {
  const int64_t rows = x.dim(0), cols = x.dim(1), k = idx.dim(1);
  if (rows * k == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, LT_INDEX_SWITCH(idx.dtype(), I, {
                    LT_CUDA_LAUNCH(blocks_for(rows * k), kThreadsPerBlock, gather_cols_kernel<T, I>)(
                        x.data<T>(), idx.data<I>(), out.data<T>(), rows, cols, k);
                  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

void scatter_add_cols(const Tensor& dout, const Tensor& idx, Tensor& dx) {
  const int64_t rows = dx.dim(0), cols = dx.dim(1), k = idx.dim(1);
  if (rows * k == 0) return;
  const DeviceGuard guard(dx.device().index);
  LT_FLOAT_SWITCH(dx.dtype(), T, LT_INDEX_SWITCH(idx.dtype(), I, {
                    LT_CUDA_LAUNCH(blocks_for(rows), kThreadsPerBlock, scatter_add_cols_kernel<T, I>)(
                        dout.data<T>(), idx.data<I>(), dx.data<T>(), rows, cols, k);
                  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
