// The NormHead front door: the inverse L2 norm of each hidden column of the head.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

void column_inv_norm(const Tensor& w, double eps, Tensor& inv_norm) {
  check_float(w, "column_inv_norm", "w");
  LT_CHECK(w.ndim() == 2, "column_inv_norm: w must be 2-D [V, H], got ", w.str());
  check_like(inv_norm, w, "column_inv_norm", "inv_norm");
  check_shape(inv_norm, {w.dim(1)}, "column_inv_norm", "inv_norm");
  if constexpr (kCudaBackend) {
    if (!w.is_cpu()) return cuda::column_inv_norm(w, eps, inv_norm);
  }
  cpu::column_inv_norm(w, eps, inv_norm);
}

}  // namespace lt::kernels
