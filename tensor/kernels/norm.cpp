// The RMSNorm front doors, forward and backward, and the residual add fused into the forward.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// Checks x [..., C] and w [C]; returns the leading shape (the shape of rstd).
Shape check_rmsnorm_operands(const Tensor& x, const Tensor& w, const char* op, const char* x_name = "x") {
  check_float(x, op, x_name);
  LT_CHECK(x.ndim() >= 1 && x.dim(-1) > 0, op, ": ", x_name, " must have a non-empty last dimension, got ", x.str());
  check_like(w, x, op, "w");
  check_shape(w, {x.dim(-1)}, op, "w");
  return Shape(x.shape().begin(), x.shape().end() - 1);
}

// The forward's outputs: y like x, rstd of the leading shape, and, where given, the bf16 copies of x and
// y, which only a GPU under mixed precision keeps.
void check_rmsnorm_outputs(const Tensor& x, const Shape& lead, const Tensor& y, const Tensor& rstd,
                           const Tensor& x_bf16, const Tensor& y_bf16, const char* op, const char* x_bf16_name) {
  check_same(y, x, op, "y");
  check_like(rstd, x, op, "rstd");
  check_shape(rstd, lead, op, "rstd");
  if (x_bf16.defined()) check_bf16_copy(x_bf16, x, op, x_bf16_name);
  if (y_bf16.defined()) check_bf16_copy(y_bf16, y, op, "y_bf16");
}

}  // namespace

void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd, const Tensor& x_bf16,
             const Tensor& y_bf16) {
  const Shape lead = check_rmsnorm_operands(x, w, "rmsnorm");
  LT_CHECK(eps >= 0, "rmsnorm: eps must be >= 0, got ", eps);
  check_rmsnorm_outputs(x, lead, y, rstd, x_bf16, y_bf16, "rmsnorm", "x_bf16");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::rmsnorm(x, w, eps, y, rstd, x_bf16, y_bf16);
  }
  cpu::rmsnorm(x, w, eps, y, rstd, x_bf16, y_bf16);
}

void add_rmsnorm(const Tensor& a, const Tensor& b, const Tensor& w, double eps, Tensor& sum, Tensor& y, Tensor& rstd,
                 const Tensor& sum_bf16, const Tensor& y_bf16) {
  const char* op = "add_rmsnorm";
  const Shape lead = check_rmsnorm_operands(a, w, op, "a");
  check_same(b, a, op, "b");
  LT_CHECK(eps >= 0, op, ": eps must be >= 0, got ", eps);
  check_same(sum, a, op, "sum");
  check_rmsnorm_outputs(a, lead, y, rstd, sum_bf16, y_bf16, op, "sum_bf16");
  check_outputs_apart(op, {{&sum, "sum"}, {&y, "y"}, {&rstd, "rstd"}}, {{&a, "a"}, {&b, "b"}, {&w, "w"}});
  if constexpr (kCudaBackend) {
    if (!a.is_cpu()) return cuda::add_rmsnorm(a, b, w, eps, sum, y, rstd, sum_bf16, y_bf16);
  }
  cpu::add_rmsnorm(a, b, w, eps, sum, y, rstd, sum_bf16, y_bf16);
}

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      double dx_beta) {
  const char* op = "rmsnorm_backward";
  const Shape lead = check_rmsnorm_operands(dy, w, op, "dy");
  check_kept_anywhere(x, dy, op, "x");
  check_shape(x, dy.shape(), op, "x");
  check_like(rstd, dy, op, "rstd");
  check_shape(rstd, lead, op, "rstd");
  check_same(dx, dy, op, "dx");
  check_like(dw, dy, op, "dw");
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
