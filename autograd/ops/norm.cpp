// rmsnorm over the last dimension: forward and backward (tensor/cpu/norm.cc has the numerics), and the
// residual add fused into its forward.
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
  // x as kept: under mixed precision its bf16 copy, which the kernels widen as they read it.
  std::vector<Tensor> backward(const Tensor& g) override {
    const Tensor& x = saved_x.stored();
    // dx goes straight into the residual stream's gradient where the stream's other use has begun it.
    GradTarget dx = grad_target(0, g);
    // The kernel accumulates dweight, so it can add straight into the weight's gradient buffer.
    GradTarget dweight = needs_grad(1) ? grad_target(1, weight) : GradTarget{Tensor::empty_like(weight)};
    if (dweight.beta == 0) dweight.tensor.zero_();
    kernels::rmsnorm_backward(x, weight, rstd, g, dx.tensor, dweight.tensor, dx.beta);
    return {dx.returned(), needs_grad(1) ? dweight.returned() : Tensor()};
  }
};

// sum = a + b of equal shapes: sum's gradient is each addend's, as add's backward gives it.
struct ResidualSumNode : Node {
  const char* name() const override { return "add_rmsnorm"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {g, g}; }
};

// The outputs y [..., C] and rstd [...] of normalising x.
std::pair<Tensor, Tensor> rmsnorm_outputs(const Tensor& x) {
  return {Tensor::empty_like(x), Tensor::empty(Shape(x.shape().begin(), x.shape().end() - 1), x.dtype(), x.device())};
}

Variable rmsnorm_result(const Variable& x, const Variable& weight, const Tensor& y, const Tensor& rstd) {
  auto node = std::make_shared<RmsNormNode>();
  if (grad_enabled()) {
    node->saved_x = SavedTensor::input(x);
    node->weight = weight.value();
    node->rstd = rstd;
  }
  return make_result(y, node, {x, weight});
}

}  // namespace

Variable rmsnorm(const Variable& x, const Variable& weight, double eps) {
  LT_PROFILE_SCOPE("rmsnorm");
  const Tensor& xv = x.value();
  LT_CHECK(xv.ndim() >= 1, "rmsnorm: x must have at least one dimension, got ", xv.str());
  auto [y, rstd] = rmsnorm_outputs(xv);
  // Under mixed precision the kernel also writes the bf16 copies the nodes keep: x's for the norm's
  // backward, y's for the projections that read y (their forward GEMMs take it, with no rounding pass).
  const Tensor y_kept = kept_copy_to_fill(y);
  kernels::rmsnorm(xv, weight.value(), eps, y, rstd, kept_copy_to_fill(x), y_kept);
  Variable result = rmsnorm_result(x, weight, y, rstd);
  keep_copy(result, y_kept);
  return result;
}

// The graph is add's and rmsnorm's, so the backward and its bits are theirs: the norm's dx joins the
// gradient of the sum's other use (the next attention's residual), then both addends receive it.
AddRmsNorm add_rmsnorm(const Variable& a, const Variable& b, const Variable& weight, double eps) {
  LT_PROFILE_SCOPE("add_rmsnorm");
  const Tensor& av = a.value();
  LT_CHECK(av.ndim() >= 1, "add_rmsnorm: a must have at least one dimension, got ", av.str());
  Tensor sum_value = Tensor::empty_like(av);
  const Variable sum = make_result(sum_value, std::make_shared<ResidualSumNode>(), {a, b});
  auto [y, rstd] = rmsnorm_outputs(av);
  const Tensor y_kept = kept_copy_to_fill(y);
  kernels::add_rmsnorm(av, b.value(), weight.value(), eps, sum_value, y, rstd, kept_copy_to_fill(sum), y_kept);
  Variable normed = rmsnorm_result(sum, weight, y, rstd);
  keep_copy(normed, y_kept);
  return {sum, normed};
}

}  // namespace lt
