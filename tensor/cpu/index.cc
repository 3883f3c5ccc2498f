// Indexing kernels: row gather / scatter-add (embedding lookup and its backward, MoE dispatch), top-k
// per row (router), and per-row column gather / scatter-add (picking the routed experts' scores).
//
// Every index is checked against its bound before any output is written, so a bad token id gives one
// clear error and leaves the output untouched. The scatter-adds never race and never use atomics:
// scatter_add_rows splits the work over columns (every output element still receives its
// contributions in n order, so the result does not even depend on the thread count), and
// scatter_add_cols splits over rows, each of which only touches its own output row.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/index.cc"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernel_util.h"
#include "tensor/cpu/topk_row.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dst[0, n) += src[0, n).
template <class T>
HWY_INLINE void AddRow(T* HWY_RESTRICT dst, const T* HWY_RESTRICT src, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Add(hn::LoadU(d, dst + i), hn::LoadU(d, src + i)), d, dst + i);
  for (; i < n; ++i) dst[i] += src[i];
}

// Rows per chunk so that each chunk moves at least ~16K elements: small tables stay on one thread.
inline int64_t RowGrain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(cols, 1)); }

template <class T, class I>
void GatherRowsT(const T* table, const I* idx, T* out, int64_t n, int64_t cols) {
  // A row copy is a memcpy: libc's copy is already as wide as the machine allows.
  parallel_for(n, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      std::memcpy(out + r * cols, table + static_cast<int64_t>(idx[r]) * cols, static_cast<size_t>(cols) * sizeof(T));
  });
}

void GatherRowsKernel(DType dtype, DType idx_dtype, const void* table, const void* idx, void* out, int64_t n,
                      int64_t cols) {
  LT_FLOAT_SWITCH(dtype, T, LT_INDEX_SWITCH(idx_dtype, I, {
    GatherRowsT<T, I>(static_cast<const T*>(table), static_cast<const I*>(idx), static_cast<T*>(out), n, cols);
  }));
}

// Columns are split between threads in blocks of this many elements: a multiple of every vector
// width, so only the last block of a row has a scalar tail, and wide enough that threads rarely share
// a cache line at a block edge.
constexpr int64_t kColumnBlock = 64;

template <class T, class I>
void ScatterAddRowsT(const T* src, const I* idx, T* out, int64_t n, int64_t cols) {
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
  // Every chunk walks all n source rows; only split when each chunk still has ~32K additions.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(n * kColumnBlock, 1));
  parallel_for(blocks, grain, [&](int64_t block_begin, int64_t block_end) {
    const int64_t c0 = block_begin * kColumnBlock;
    const int64_t width = std::min(cols, block_end * kColumnBlock) - c0;
    for (int64_t r = 0; r < n; ++r) AddRow(out + static_cast<int64_t>(idx[r]) * cols + c0, src + r * cols + c0, width);
  });
}

void ScatterAddRowsKernel(DType dtype, DType idx_dtype, const void* src, const void* idx, void* out, int64_t n,
                          int64_t cols) {
  LT_FLOAT_SWITCH(dtype, T, LT_INDEX_SWITCH(idx_dtype, I, {
    ScatterAddRowsT<T, I>(static_cast<const T*>(src), static_cast<const I*>(idx), static_cast<T*>(out), n, cols);
  }));
}

template <class T>
void TopKT(const T* x, T* values, int32_t* indices, int64_t rows, int64_t cols, int64_t k) {
  parallel_for(rows, RowGrain(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) TopKRow(x + r * cols, cols, k, values + r * k, indices + r * k);
  });
}

void TopKKernel(DType dtype, const void* x, void* values, int32_t* indices, int64_t rows, int64_t cols, int64_t k) {
  LT_FLOAT_SWITCH(dtype, T, TopKT<T>(static_cast<const T*>(x), static_cast<T*>(values), indices, rows, cols, k));
}

// out[r, j] = x[r, idx[r, j]] for x [rows, cols] and idx, out [rows, k].
template <class T, class I>
void GatherColsT(const T* x, const I* idx, T* out, int64_t rows, int64_t cols, int64_t k) {
  parallel_for(rows, RowGrain(k), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < k; ++j) out[r * k + j] = x[r * cols + static_cast<int64_t>(idx[r * k + j])];
  });
}

void GatherColsKernel(DType dtype, DType idx_dtype, const void* x, const void* idx, void* out, int64_t rows,
                      int64_t cols, int64_t k) {
  LT_FLOAT_SWITCH(dtype, T, LT_INDEX_SWITCH(idx_dtype, I, {
    GatherColsT<T, I>(static_cast<const T*>(x), static_cast<const I*>(idx), static_cast<T*>(out), rows, cols, k);
  }));
}

// dx[r, idx[r, j]] += dout[r, j]. A thread owns whole rows of dx, and within a row a repeated index
// receives its contributions in j order.
template <class T, class I>
void ScatterAddColsT(const T* dout, const I* idx, T* dx, int64_t rows, int64_t cols, int64_t k) {
  parallel_for(rows, RowGrain(k), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t j = 0; j < k; ++j) dx[r * cols + static_cast<int64_t>(idx[r * k + j])] += dout[r * k + j];
  });
}

void ScatterAddColsKernel(DType dtype, DType idx_dtype, const void* dout, const void* idx, void* dx, int64_t rows,
                          int64_t cols, int64_t k) {
  LT_FLOAT_SWITCH(dtype, T, LT_INDEX_SWITCH(idx_dtype, I, {
    ScatterAddColsT<T, I>(static_cast<const T*>(dout), static_cast<const I*>(idx), static_cast<T*>(dx), rows, cols, k);
  }));
}

}  // namespace lt::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::kernels {
HWY_EXPORT(GatherRowsKernel);
HWY_EXPORT(ScatterAddRowsKernel);
HWY_EXPORT(TopKKernel);
HWY_EXPORT(GatherColsKernel);
HWY_EXPORT(ScatterAddColsKernel);

namespace {

// One serial pass before the kernel runs: the indices are few next to the data they move, and
// checking first means a bad index leaves the output untouched.
template <class I>
void check_range(const I* idx, int64_t n, int64_t bound, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    LT_CHECK(idx[i] >= 0 && static_cast<int64_t>(idx[i]) < bound, op, ": index ", static_cast<int64_t>(idx[i]),
             " at position ", i, " is out of range [0, ", bound, ")");
}

void check_indices(const Tensor& idx, int64_t bound, const char* op) {
  LT_INDEX_SWITCH(idx.dtype(), I, check_range(idx.data<I>(), idx.numel(), bound, op));
}

Shape with_last(const Shape& lead, int64_t last) {
  Shape shape = lead;
  shape.push_back(last);
  return shape;
}

// The operands of gather_cols / scatter_add_cols: wide [N, E], idx and narrow [N, K].
void check_cols(const Tensor& wide, const Tensor& idx, const Tensor& narrow, const char* op, const char* wide_name,
                const char* narrow_name) {
  check_float(wide, op, wide_name);
  check_index(idx, op, "idx");
  check_like(narrow, wide, op, narrow_name);
  require_cpu(wide, op);
  require_cpu(idx, op);
  require_cpu(narrow, op);
  LT_CHECK(wide.ndim() == 2, op, ": ", wide_name, " must be 2-D [N, E], got ", wide.str());
  LT_CHECK(idx.ndim() == 2 && idx.dim(0) == wide.dim(0), op, ": idx must be [", wide.dim(0), ", K], got ", idx.str());
  check_shape(narrow, idx.shape(), op, narrow_name);
  check_indices(idx, wide.dim(1), op);
}

}  // namespace

void gather_rows(const Tensor& table, const Tensor& idx, Tensor& out) {
  check_float(table, "gather_rows", "table");
  check_index(idx, "gather_rows", "idx");
  check_like(out, table, "gather_rows", "out");
  require_cpu(table, "gather_rows");
  require_cpu(idx, "gather_rows");
  require_cpu(out, "gather_rows");
  LT_CHECK(table.ndim() == 2, "gather_rows: table must be 2-D [R, C], got ", table.str());
  check_shape(out, with_last(idx.shape(), table.dim(1)), "gather_rows", "out");
  check_indices(idx, table.dim(0), "gather_rows");
  HWY_DYNAMIC_DISPATCH(GatherRowsKernel)(table.dtype(), idx.dtype(), table.raw_data(), idx.raw_data(), out.raw_data(),
                                         idx.numel(), table.dim(1));
}

void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& out) {
  check_float(src, "scatter_add_rows", "src");
  check_index(idx, "scatter_add_rows", "idx");
  check_like(out, src, "scatter_add_rows", "out");
  require_cpu(src, "scatter_add_rows");
  require_cpu(idx, "scatter_add_rows");
  require_cpu(out, "scatter_add_rows");
  LT_CHECK(out.ndim() == 2, "scatter_add_rows: out must be 2-D [R, C], got ", out.str());
  check_shape(src, with_last(idx.shape(), out.dim(1)), "scatter_add_rows", "src");
  check_indices(idx, out.dim(0), "scatter_add_rows");
  HWY_DYNAMIC_DISPATCH(ScatterAddRowsKernel)(src.dtype(), idx.dtype(), src.raw_data(), idx.raw_data(), out.raw_data(),
                                             idx.numel(), out.dim(1));
}

void topk(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  check_float(x, "topk", "x");
  check_like(values, x, "topk", "values");
  require_cpu(x, "topk");
  require_cpu(values, "topk");
  require_cpu(indices, "topk");
  LT_CHECK(x.ndim() == 2, "topk: x must be 2-D [N, E], got ", x.str());
  const int64_t rows = x.dim(0), cols = x.dim(1);
  LT_CHECK(k >= 1 && k <= cols, "topk: k = ", k, " must be in [1, ", cols, "] for x ", x.str());
  LT_CHECK(cols <= std::numeric_limits<int32_t>::max(), "topk: ", cols, " columns do not fit i32 indices");
  LT_CHECK(indices.defined() && indices.dtype() == DType::I32, "topk: indices must be i32, got ",
           indices.defined() ? indices.str() : "undefined");
  check_shape(values, {rows, k}, "topk", "values");
  check_shape(indices, {rows, k}, "topk", "indices");
  HWY_DYNAMIC_DISPATCH(TopKKernel)(x.dtype(), x.raw_data(), values.raw_data(), indices.data<int32_t>(), rows, cols, k);
}

void gather_cols(const Tensor& x, const Tensor& idx, Tensor& out) {
  check_cols(x, idx, out, "gather_cols", "x", "out");
  HWY_DYNAMIC_DISPATCH(GatherColsKernel)(x.dtype(), idx.dtype(), x.raw_data(), idx.raw_data(), out.raw_data(), x.dim(0),
                                         x.dim(1), idx.dim(1));
}

void scatter_add_cols(const Tensor& dout, const Tensor& idx, Tensor& dx) {
  check_cols(dx, idx, dout, "scatter_add_cols", "dx", "dout");
  HWY_DYNAMIC_DISPATCH(ScatterAddColsKernel)(dx.dtype(), idx.dtype(), dout.raw_data(), idx.raw_data(), dx.raw_data(),
                                             dx.dim(0), dx.dim(1), idx.dim(1));
}

}  // namespace lt::kernels
#endif  // HWY_ONCE
