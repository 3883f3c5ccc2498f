// The RMSNorm front doors, forward and backward.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// Checks x [..., C] and w [C]; returns the leading shape (the shape of rstd).
Shape check_rmsnorm_operands(const Tensor& x, const Tensor& w, const char* op) {
  check_float(x, op, "x");
  LT_CHECK(x.ndim() >= 1 && x.dim(-1) > 0, op, ": x must have a non-empty last dimension, got ", x.str());
  check_like(w, x, op, "w");
  check_shape(w, {x.dim(-1)}, op, "w");
  return Shape(x.shape().begin(), x.shape().end() - 1);
}

}  // namespace

void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd) {
  const Shape lead = check_rmsnorm_operands(x, w, "rmsnorm");
  LT_CHECK(eps >= 0, "rmsnorm: eps must be >= 0, got ", eps);
  check_same(y, x, "rmsnorm", "y");
  check_like(rstd, x, "rmsnorm", "rstd");
  check_shape(rstd, lead, "rmsnorm", "rstd");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::rmsnorm(x, w, eps, y, rstd);
  }
  cpu::rmsnorm(x, w, eps, y, rstd);
}

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                      Tensor& dw) {
  const Shape lead = check_rmsnorm_operands(x, w, "rmsnorm_backward");
  check_like(rstd, x, "rmsnorm_backward", "rstd");
  check_shape(rstd, lead, "rmsnorm_backward", "rstd");
  check_same(dy, x, "rmsnorm_backward", "dy");
  check_same(dx, x, "rmsnorm_backward", "dx");
  check_like(dw, x, "rmsnorm_backward", "dw");
  check_shape(dw, w.shape(), "rmsnorm_backward", "dw");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::rmsnorm_backward(x, w, rstd, dy, dx, dw);
  }
  cpu::rmsnorm_backward(x, w, rstd, dy, dx, dw);
}

}  // namespace lt::kernels
