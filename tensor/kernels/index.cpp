// The indexing front doors: row gather / scatter-add, top-k per row, column gather / scatter-add.
//
// Every index is checked against its bound before any kernel runs, so a bad token id gives one clear
// error and leaves the output untouched.
#include <limits>

#include "tensor/dtype_switch.h"
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

namespace {
thread_local int trusted_device_index_scopes = 0;
}  // namespace
TrustedDeviceIndices::TrustedDeviceIndices() { ++trusted_device_index_scopes; }
TrustedDeviceIndices::~TrustedDeviceIndices() { --trusted_device_index_scopes; }
bool device_indices_trusted() { return trusted_device_index_scopes > 0; }

OutOfRange first_out_of_range_on_host(const Tensor& ids, const IndexRange& range) {
  LT_CHECK(ids.is_cpu(), "first_out_of_range_on_host: ", ids.str(), " is not on the host");
  LT_INDEX_SWITCH(ids.dtype(), I, {
    const I* id = ids.data<I>();
    for (int64_t i = 0; i < ids.numel(); ++i)
      if (!range.allows(static_cast<int64_t>(id[i]))) return OutOfRange{i, static_cast<int64_t>(id[i])};
  });
  return {};
}

namespace {

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
  check_device(idx, wide, op, "idx");
  LT_CHECK(wide.ndim() == 2, op, ": ", wide_name, " must be 2-D [N, E], got ", wide.str());
  LT_CHECK(idx.ndim() == 2 && idx.dim(0) == wide.dim(0), op, ": idx must be [", wide.dim(0), ", K], got ", idx.str());
  check_shape(narrow, idx.shape(), op, narrow_name);
  check_indices(idx, wide.dim(1), op);
}

}  // namespace

void gather_rows(const Tensor& table, const Tensor& idx, Tensor& out) {
  // A bf16 table (an activation's kept copy) gathered into bf16 rows, and on a GPU an f32 table too (rounded
  // in the same pass): a mixed-precision GEMM's operand (tensor/kernels/moe_stats.cpp), or the rows expert
  // parallelism sends (moe/expert_parallel.cpp).
  const bool to_bf16 = out.dtype() == DType::BF16 &&
                       (table.dtype() == DType::BF16 || (table.dtype() == DType::F32 && !table.is_cpu()));
  if (!to_bf16) check_float(table, "gather_rows", "table");
  check_index(idx, "gather_rows", "idx");
  check_like(out, to_bf16 ? out : table, "gather_rows", "out");
  check_device(out, table, "gather_rows", "out");
  check_device(idx, table, "gather_rows", "idx");
  LT_CHECK(table.ndim() == 2, "gather_rows: table must be 2-D [R, C], got ", table.str());
  check_shape(out, with_last(idx.shape(), table.dim(1)), "gather_rows", "out");
  check_indices(idx, table.dim(0), "gather_rows");
  if constexpr (kCudaBackend) {
    if (!table.is_cpu()) return cuda::gather_rows(table, idx, out);
  }
  cpu::gather_rows(table, idx, out);
}

void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& out) {
  check_float(src, "scatter_add_rows", "src");
  check_index(idx, "scatter_add_rows", "idx");
  check_like(out, src, "scatter_add_rows", "out");
  check_device(idx, src, "scatter_add_rows", "idx");
  LT_CHECK(out.ndim() == 2, "scatter_add_rows: out must be 2-D [R, C], got ", out.str());
  check_shape(src, with_last(idx.shape(), out.dim(1)), "scatter_add_rows", "src");
  check_indices(idx, out.dim(0), "scatter_add_rows");
  if constexpr (kCudaBackend) {
    if (!src.is_cpu()) return cuda::scatter_add_rows(src, idx, out);
  }
  cpu::scatter_add_rows(src, idx, out);
}

void topk(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  check_float(x, "topk", "x");
  check_like(values, x, "topk", "values");
  LT_CHECK(x.ndim() == 2, "topk: x must be 2-D [N, E], got ", x.str());
  const int64_t rows = x.dim(0), cols = x.dim(1);
  LT_CHECK(k >= 1 && k <= cols, "topk: k = ", k, " must be in [1, ", cols, "] for x ", x.str());
  LT_CHECK(cols <= std::numeric_limits<int32_t>::max(), "topk: ", cols, " columns do not fit i32 indices");
  LT_CHECK(indices.defined() && indices.dtype() == DType::I32, "topk: indices must be i32, got ",
           indices.defined() ? indices.str() : "undefined");
  check_device(indices, x, "topk", "indices");
  check_shape(values, {rows, k}, "topk", "values");
  check_shape(indices, {rows, k}, "topk", "indices");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::topk(x, k, values, indices);
  }
  cpu::topk(x, k, values, indices);
}

void gather_cols(const Tensor& x, const Tensor& idx, Tensor& out) {
  check_cols(x, idx, out, "gather_cols", "x", "out");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::gather_cols(x, idx, out);
  }
  cpu::gather_cols(x, idx, out);
}

void scatter_add_cols(const Tensor& dout, const Tensor& idx, Tensor& dx) {
  check_cols(dx, idx, dout, "scatter_add_cols", "dx", "dout");
  if constexpr (kCudaBackend) {
    if (!dx.is_cpu()) return cuda::scatter_add_cols(dout, idx, dx);
  }
  cpu::scatter_add_cols(dout, idx, dx);
}

}  // namespace lt::kernels
