// rmsnorm over the last dimension: forward and backward (tensor/cpu/norm.cc has the numerics).
#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct RmsNormNode : Node {
  Tensor x, weight, rstd;  // rstd = 1 / sqrt(mean(x^2) + eps) per row, saved by the forward
  const char* name() const override { return "rmsnorm"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = Tensor::empty_like(x);
    Tensor dweight = Tensor::zeros_like(weight);  // the kernel accumulates into it
    kernels::rmsnorm_backward(x, weight, rstd, g, dx, dweight);
    return {dx, needs_grad(1) ? dweight : Tensor()};
  }
};

}  // namespace

Variable rmsnorm(const Variable& x, const Variable& weight, double eps) {
  const Tensor& xv = x.value();
  LT_CHECK(xv.ndim() >= 1, "rmsnorm: x must have at least one dimension, got ", xv.str());
  Tensor y = Tensor::empty_like(xv);
  Tensor rstd = Tensor::empty(Shape(xv.shape().begin(), xv.shape().end() - 1), xv.dtype(), xv.device());
  kernels::rmsnorm(xv, weight.value(), eps, y, rstd);
  auto node = std::make_shared<RmsNormNode>();
  if (grad_enabled()) {
    node->x = xv;
    node->weight = weight.value();
    node->rstd = rstd;
  }
  return make_result(y, node, {x, weight});
}

}  // namespace lt
