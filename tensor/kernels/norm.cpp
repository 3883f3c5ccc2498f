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

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      double dx_beta) {
  const char* op = "rmsnorm_backward";
  const Shape lead = check_rmsnorm_operands(x, w, op);
  check_like(rstd, x, op, "rstd");
  check_shape(rstd, lead, op, "rstd");
  check_same(dy, x, op, "dy");
  check_same(dx, x, op, "dx");
  check_like(dw, x, op, "dw");
  check_shape(dw, w.shape(), op, "dw");
  LT_CHECK(dx_beta == 0 || dx_beta == 1, op, ": dx_beta must be 0 or 1, got ", dx_beta);
  check_outputs_apart(op, {{&dx, "dx"}, {&dw, "dw"}}, {{&x, "x"}, {&w, "w"}, {&rstd, "rstd"}, {&dy, "dy"}});
  const bool add_to_dx = dx_beta == 1;
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::rmsnorm_backward(x, w, rstd, dy, dx, dw, add_to_dx);
  }
  cpu::rmsnorm_backward(x, w, rstd, dy, dx, dw, add_to_dx);
}

}  // namespace lt::kernels
