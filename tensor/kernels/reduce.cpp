// The reduction front doors: the sum of all elements, of their squares, and sums over the last dim.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

void sum(const Tensor& x, Tensor& out) {
  check_float(x, "sum", "x");
  check_like(out, x, "sum", "out");
  LT_CHECK(out.numel() == 1, "sum: out must hold one element, got ", out.str());
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::sum(x, out);
  }
  cpu::sum(x, out);
}

void sum_squares(const Tensor& x, Tensor& out) {
  check_float(x, "sum_squares", "x");
  check_like(out, x, "sum_squares", "out");
  LT_CHECK(out.numel() == 1, "sum_squares: out must hold one element, got ", out.str());
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::sum_squares(x, out);
  }
  cpu::sum_squares(x, out);
}

void sum_last_dim(const Tensor& x, Tensor& out) {
  check_float(x, "sum_last_dim", "x");
  check_like(out, x, "sum_last_dim", "out");
  LT_CHECK(x.ndim() >= 1, "sum_last_dim: x must have at least one dimension");
  Shape lead(x.shape().begin(), x.shape().end() - 1);
  check_shape(out, lead, "sum_last_dim", "out");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::sum_last_dim(x, out);
  }
  cpu::sum_last_dim(x, out);
}

}  // namespace lt::kernels
