// add, sub, mul (with b broadcast over the leading dims of a) and scale: forward and backward.
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

// The gradient of a broadcast operand: summed over the dims it was broadcast over.
Tensor reduce_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  Tensor out = Tensor::empty(shape, grad.dtype(), grad.device());
  kernels::sum_to(grad, out);
  return out;
}

struct AddNode : Node {
  Shape b_shape;
  double b_sign;  // +1 for add, -1 for sub
  const char* name() const override { return b_sign > 0 ? "add" : "sub"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor db;
    if (needs_grad(1)) {
      db = reduce_to(g, b_shape);
      if (b_sign < 0) {
        Tensor neg = Tensor::empty_like(db);
        kernels::scale(db, -1.0, neg);
        db = neg;
      }
    }
    return {g, db};
  }
};

Variable add_or_sub(const Variable& a, const Variable& b, double sign) {
  LT_PROFILE_SCOPE(sign > 0 ? "add" : "sub");
  Tensor out = Tensor::empty_like(a.value());
  if (sign > 0) kernels::add(a.value(), b.value(), out);
  else kernels::sub(a.value(), b.value(), out);
  auto node = std::make_shared<AddNode>();
  node->b_shape = b.shape();
  node->b_sign = sign;
  return make_result(out, node, {a, b});
}

struct MulNode : Node {
  Tensor a, b;
  const char* name() const override { return "mul"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor da, db;
    if (needs_grad(0)) {  // da = g * b (b broadcast)
      da = Tensor::empty_like(g);
      kernels::mul(g, b, da);
    }
    if (needs_grad(1)) {  // db = sum over broadcast dims of g * a
      Tensor g_a = Tensor::empty_like(g);
      kernels::mul(g, a, g_a);
      db = reduce_to(g_a, b.shape());
    }
    return {da, db};
  }
};

struct ScaleNode : Node {
  double alpha;
  const char* name() const override { return "scale"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = Tensor::empty_like(g);
    kernels::scale(g, alpha, dx);
    return {dx};
  }
};

}  // namespace

Variable add(const Variable& a, const Variable& b) { return add_or_sub(a, b, +1.0); }
Variable sub(const Variable& a, const Variable& b) { return add_or_sub(a, b, -1.0); }

Variable mul(const Variable& a, const Variable& b) {
  LT_PROFILE_SCOPE("mul");
  Tensor out = Tensor::empty_like(a.value());
  kernels::mul(a.value(), b.value(), out);
  auto node = std::make_shared<MulNode>();
  if (grad_enabled()) {
    node->a = a.value();
    node->b = b.value();
  }
  return make_result(out, node, {a, b});
}

Variable scale(const Variable& x, double alpha) {
  LT_PROFILE_SCOPE("scale");
  Tensor out = Tensor::empty_like(x.value());
  kernels::scale(x.value(), alpha, out);
  auto node = std::make_shared<ScaleNode>();
  node->alpha = alpha;
  return make_result(out, node, {x});
}

}  // namespace lt
