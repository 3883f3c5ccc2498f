// rmsnorm over the last dimension: forward and backward (tensor/cpu/norm.cc has the numerics).
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "autograd/saved.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct RmsNormNode : Node {
  SavedTensor saved_x;
  Tensor weight, rstd;  // rstd = 1 / sqrt(mean(x^2) + eps) per row, saved by the forward
  const char* name() const override { return "rmsnorm"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    const Tensor x = saved_x.get();
    // dx goes straight into the residual stream's gradient where the stream's other use has begun it.
    GradTarget dx = grad_target(0, x);
    // The kernel accumulates dweight, so it can add straight into the weight's gradient buffer.
    GradTarget dweight = needs_grad(1) ? grad_target(1, weight) : GradTarget{Tensor::empty_like(weight)};
    if (dweight.beta == 0) dweight.tensor.zero_();
    kernels::rmsnorm_backward(x, weight, rstd, g, dx.tensor, dweight.tensor, dx.beta);
    return {dx.returned(), needs_grad(1) ? dweight.returned() : Tensor()};
  }
};

}  // namespace

Variable rmsnorm(const Variable& x, const Variable& weight, double eps) {
  LT_PROFILE_SCOPE("rmsnorm");
  const Tensor& xv = x.value();
  LT_CHECK(xv.ndim() >= 1, "rmsnorm: x must have at least one dimension, got ", xv.str());
  Tensor y = Tensor::empty_like(xv);
  Tensor rstd = Tensor::empty(Shape(xv.shape().begin(), xv.shape().end() - 1), xv.dtype(), xv.device());
  kernels::rmsnorm(xv, weight.value(), eps, y, rstd);
  auto node = std::make_shared<RmsNormNode>();
  if (grad_enabled()) {
    node->saved_x = SavedTensor::input(x);
    node->weight = weight.value();
    node->rstd = rstd;
  }
  return make_result(y, node, {x, weight});
}

}  // namespace lt
