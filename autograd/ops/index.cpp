// Indexing ops: embedding / gather_rows, scatter_add_rows, gather_cols and topk, forward and backward.
//
// The pairs are each other's backward: a row gather sends its gradient back with a scatter-add (a row
// used twice, e.g. a repeated token id, sums both gradients), and a scatter-add's gradient is a gather.
// Indices are integer tensors, not Variables: they carry no gradient. The nodes keep a reference to
// them, so callers must not overwrite an index tensor before backward has run.
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

Shape with_last(const Shape& lead, int64_t last) {
  Shape shape = lead;
  shape.push_back(last);
  return shape;
}

// out = table[idx] row by row; backward scatter-adds into a zeroed table-shaped gradient.
struct GatherRowsNode : Node {
  const char* op_name;  // "embedding" or "gather_rows": the same math, named as the caller wrote it
  Tensor idx;
  Shape table_shape;
  const char* name() const override { return op_name; }
  std::vector<Tensor> backward(const Tensor& g) override {
    // Scatter-adds straight into the table's gradient buffer when it has one (the embedding).
    GradTarget dtable = grad_target(0, table_shape, g.dtype(), g.device());
    if (dtable.beta == 0) dtable.tensor.zero_();
    kernels::scatter_add_rows(g, idx, dtable.tensor);
    return {dtable.returned()};
  }
};

Variable gather_rows_op(const char* op_name, const Variable& table, const Tensor& idx) {
  LT_PROFILE_SCOPE(op_name);
  const Tensor& tv = table.value();
  LT_CHECK(tv.ndim() == 2, op_name, ": table must be 2-D [R, C], got ", tv.str());
  Tensor out = Tensor::empty(with_last(idx.shape(), tv.dim(1)), tv.dtype(), tv.device());
  kernels::gather_rows(tv, idx, out);
  auto node = std::make_shared<GatherRowsNode>();
  node->op_name = op_name;
  node->idx = idx;
  node->table_shape = tv.shape();
  return make_result(out, node, {table});
}

struct ScatterAddRowsNode : Node {
  Tensor idx;
  Shape src_shape;
  const char* name() const override { return "scatter_add_rows"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dsrc = Tensor::empty(src_shape, g.dtype(), g.device());
    kernels::gather_rows(g, idx, dsrc);
    return {dsrc};
  }
};

// out[n, j] = x[n, idx[n, j]]; backward scatter-adds into a zeroed x-shaped gradient, so a column
// picked twice in a row receives both gradients and columns never picked receive zero.
struct GatherColsNode : Node {
  Tensor idx;
  Shape x_shape;
  const char* name() const override { return "gather_cols"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = Tensor::zeros(x_shape, g.dtype(), g.device());
    kernels::scatter_add_cols(g, idx, dx);
    return {dx};
  }
};

// Records `out` (already holding x gathered by idx) as gather_cols of x.
Variable record_gather_cols(const Variable& x, const Tensor& idx, Tensor out) {
  auto node = std::make_shared<GatherColsNode>();
  node->idx = idx;
  node->x_shape = x.shape();
  return make_result(std::move(out), node, {x});
}

}  // namespace

Variable embedding(const Variable& table, const Tensor& ids) { return gather_rows_op("embedding", table, ids); }

Variable gather_rows(const Variable& x, const Tensor& idx) { return gather_rows_op("gather_rows", x, idx); }

Variable scatter_add_rows(const Variable& src, const Tensor& idx, int64_t rows) {
  LT_PROFILE_SCOPE("scatter_add_rows");
  const Tensor& sv = src.value();
  LT_CHECK(sv.ndim() >= 1, "scatter_add_rows: src must have a last dimension, got ", sv.str());
  LT_CHECK(rows >= 0, "scatter_add_rows: rows must be >= 0, got ", rows);
  Tensor out = Tensor::zeros({rows, sv.dim(-1)}, sv.dtype(), sv.device());
  kernels::scatter_add_rows(sv, idx, out);
  auto node = std::make_shared<ScatterAddRowsNode>();
  node->idx = idx;
  node->src_shape = sv.shape();
  return make_result(out, node, {src});
}

Variable gather_cols(const Variable& x, const Tensor& idx) {
  LT_PROFILE_SCOPE("gather_cols");
  Tensor out = Tensor::empty(idx.shape(), x.value().dtype(), x.value().device());
  kernels::gather_cols(x.value(), idx, out);
  return record_gather_cols(x, idx, out);
}

TopK topk(const Variable& x, int64_t k) {
  LT_PROFILE_SCOPE("topk");
  const Tensor& xv = x.value();
  LT_CHECK(xv.ndim() == 2, "topk: x must be 2-D [N, E], got ", xv.str());
  LT_CHECK(k >= 1 && k <= xv.dim(1), "topk: k = ", k, " must be in [1, ", xv.dim(1), "] for x ", xv.str());
  Tensor values = Tensor::empty({xv.dim(0), k}, xv.dtype(), xv.device());
  Tensor indices = Tensor::empty({xv.dim(0), k}, DType::I32, xv.device());
  kernels::topk(xv, k, values, indices);
  // The selected values are exactly x gathered at the indices, so they are recorded as that gather
  // (no second pass over x) and the gradient reaches the selected entries only.
  return {record_gather_cols(x, indices, values), indices};
}

}  // namespace lt
