// reshape, call_before_backward, slice_cols, sum and mean: forward and backward.
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct ReshapeNode : Node {
  Shape input_shape;
  const char* name() const override { return "reshape"; }
  // The gradient goes on as a view of itself: read in GEMMs only where the input's node reads it so (a
  // Linear's product, reshaped back to its input's leading dims).
  bool reads_gradient_in_gemms_only() const override { return gradient_feeds_gemms_only(0); }
  std::vector<Tensor> backward(const Tensor& g) override { return {g.reshape(input_shape)}; }
};

struct CallBeforeBackwardNode : Node {
  std::function<void()> before;
  const char* name() const override { return "call_before_backward"; }
  bool reads_gradient_in_gemms_only() const override { return gradient_feeds_gemms_only(0); }
  std::vector<Tensor> backward(const Tensor& g) override {
    before();
    return {g};
  }
};

struct SliceColsNode : Node {
  Shape input_shape;
  int64_t start;
  const char* name() const override { return "slice_cols"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = Tensor::zeros(input_shape, g.dtype(), g.device());
    kernels::add_to_cols(g, start, dx);
    return {dx};
  }
};

// sum and mean: every input element receives the (scaled) incoming scalar gradient.
struct SumNode : Node {
  Shape input_shape;
  double factor;  // 1 for sum, 1/n for mean
  const char* name() const override { return factor == 1.0 ? "sum" : "mean"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {Tensor::full(input_shape, g.item() * factor, g.dtype(), g.device())};
  }
};

Variable reduce_all(const Variable& x, double factor) {
  LT_PROFILE_SCOPE(factor == 1.0 ? "sum" : "mean");
  Tensor total = Tensor::empty({1}, x.value().dtype(), x.value().device());
  kernels::sum(x.value(), total);
  if (factor != 1.0) kernels::scale(total, factor, total);
  auto node = std::make_shared<SumNode>();
  node->input_shape = x.shape();
  node->factor = factor;
  return make_result(total, node, {x});
}

// A view of x's value shares its bf16 slot (autograd/saved.h); only GPU values are ever kept in bf16.
Variable share_bf16_slot(const Variable& x, Variable result) {
  if (!x.value().is_cpu()) {
    if (!x.impl()->saved_bf16) x.impl()->saved_bf16 = std::make_shared<Tensor>();
    result.impl()->saved_bf16 = x.impl()->saved_bf16;
  }
  return result;
}

}  // namespace

Variable reshape(const Variable& x, const Shape& shape) {
  LT_PROFILE_SCOPE("reshape");
  Tensor view = x.value().reshape(shape);
  // To its own shape (a Linear's [N, C] input, already 2-D): x itself, with no node in between, so that
  // the consumer's backward can add straight into x's gradient (Node::grad_target) rather than hand the
  // engine a view of a separate one to sum.
  if (view.shape() == x.shape()) return x;
  auto node = std::make_shared<ReshapeNode>();
  node->input_shape = x.shape();
  return share_bf16_slot(x, make_result(std::move(view), node, {x}));
}

Variable call_before_backward(const Variable& x, std::function<void()> before) {
  auto node = std::make_shared<CallBeforeBackwardNode>();
  node->before = std::move(before);
  return share_bf16_slot(x, make_result(x.value(), node, {x}));
}

Variable slice_cols(const Variable& x, int64_t start, int64_t width) {
  LT_PROFILE_SCOPE("slice_cols");
  Shape out_shape = x.shape();
  LT_CHECK(!out_shape.empty(), "slice_cols: x has no last dimension");
  out_shape.back() = width;
  Tensor out = Tensor::empty(out_shape, x.value().dtype(), x.value().device());
  kernels::copy_cols(x.value(), start, out);
  auto node = std::make_shared<SliceColsNode>();
  node->input_shape = x.shape();
  node->start = start;
  return make_result(out, node, {x});
}

Variable sum(const Variable& x) { return reduce_all(x, 1.0); }

Variable mean(const Variable& x) {
  LT_CHECK(x.value().numel() > 0, "mean of an empty tensor");
  return reduce_all(x, 1.0 / static_cast<double>(x.value().numel()));
}

}  // namespace lt
