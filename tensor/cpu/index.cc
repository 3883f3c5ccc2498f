// Indexing kernels: row gather / scatter-add (embedding lookup and its backward, MoE dispatch), top-k
// per row (router), and per-row column gather / scatter-add (picking the routed experts' scores).
//
// The front door (tensor/kernels/index.cpp) has checked every index against its bound. The
// scatter-adds never race and never use atomics: scatter_add_rows splits the work over columns (every
// output element still receives its contributions in n order, so the result does not even depend on
// the thread count), and scatter_add_cols splits over rows, each of which only touches its own output
// row.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/index.cc"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernels.h"
#include "tensor/topk_row.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
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

// bf16 rows (uint16_t) move as they are.
void GatherRowsKernel(DType dtype, DType idx_dtype, const void* table, const void* idx, void* out, int64_t n,
                      int64_t cols) {
  if (dtype == DType::BF16) {
    LT_INDEX_SWITCH(idx_dtype, I, {
      GatherRowsT<uint16_t, I>(static_cast<const uint16_t*>(table), static_cast<const I*>(idx),
                               static_cast<uint16_t*>(out), n, cols);
    });
    return;
  }
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

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(GatherRowsKernel);
HWY_EXPORT(ScatterAddRowsKernel);
HWY_EXPORT(TopKKernel);
HWY_EXPORT(GatherColsKernel);
HWY_EXPORT(ScatterAddColsKernel);

void gather_rows(const Tensor& table, const Tensor& idx, Tensor& out) {
  HWY_DYNAMIC_DISPATCH(GatherRowsKernel)(table.dtype(), idx.dtype(), table.raw_data(), idx.raw_data(), out.raw_data(),
                                         idx.numel(), table.dim(1));
}

void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& out) {
  HWY_DYNAMIC_DISPATCH(ScatterAddRowsKernel)(src.dtype(), idx.dtype(), src.raw_data(), idx.raw_data(), out.raw_data(),
                                             idx.numel(), out.dim(1));
}

void topk(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  HWY_DYNAMIC_DISPATCH(TopKKernel)(x.dtype(), x.raw_data(), values.raw_data(), indices.data<int32_t>(), x.dim(0),
                                   x.dim(1), k);
}

void gather_cols(const Tensor& x, const Tensor& idx, Tensor& out) {
  HWY_DYNAMIC_DISPATCH(GatherColsKernel)(x.dtype(), idx.dtype(), x.raw_data(), idx.raw_data(), out.raw_data(), x.dim(0),
                                         x.dim(1), idx.dim(1));
}

void scatter_add_cols(const Tensor& dout, const Tensor& idx, Tensor& dx) {
  HWY_DYNAMIC_DISPATCH(ScatterAddColsKernel)(dx.dtype(), idx.dtype(), dout.raw_data(), idx.raw_data(), dx.raw_data(),
                                             dx.dim(0), dx.dim(1), idx.dim(1));
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
