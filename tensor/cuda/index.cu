// Indexing CUDA kernels: the device-side range check of index tensors, row gather / scatter-add
// (embedding lookup and its backward, MoE dispatch), top-k per row, and per-row column gather /
// scatter-add, with the CPU kernels' results (tensor/cpu/index.cc).
//
// Determinism without atomics: scatter_add_rows gives each thread one column and walks the source rows
// in order, so every output element receives its contributions in row order, exactly as on the CPU;
// scatter_add_cols gives each thread one row, which only touches its own output row. The price is
// parallelism over columns only in scatter_add_rows (the embedding backward): its rows are a serial
// loop per thread.
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
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

template <class T, class I>
__global__ void scatter_add_rows_kernel(const T* src, const I* idx, T* out, int64_t n, int64_t cols) {
  for (int64_t c = first_index(); c < cols; c += grid_stride())
    for (int64_t r = 0; r < n; ++r) out[static_cast<int64_t>(idx[r]) * cols + c] += src[r * cols + c];
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
  LT_FLOAT_SWITCH(src.dtype(), T, LT_INDEX_SWITCH(idx.dtype(), I, {
                    LT_CUDA_LAUNCH(blocks_for(cols), kThreadsPerBlock, scatter_add_rows_kernel<T, I>)(
                        src.data<T>(), idx.data<I>(), out.data<T>(), n, cols);
                  }));
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
