// The activation front doors: SiLU and SwiGLU, forward and backward.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

void silu(const Tensor& x, Tensor& y) {
  check_float(x, "silu", "x");
  check_same(y, x, "silu", "y");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::silu(x, y);
  }
  cpu::silu(x, y);
}

void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  check_float(x, "silu_backward", "x");
  check_same(dy, x, "silu_backward", "dy");
  check_same(dx, x, "silu_backward", "dx");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::silu_backward(x, dy, dx);
  }
  cpu::silu_backward(x, dy, dx);
}

void swiglu(const Tensor& gate_up, Tensor& y, const Tensor& gate_up_kept, const Tensor& y_kept) {
  const char* op = "swiglu";
  check_float(gate_up, op, "gate_up");
  check_gate_up(gate_up, y, gate_up, op, "y");
  check_outputs_apart(op, {{&y, "y"}}, {{&gate_up, "gate_up"}});
  if (gate_up_kept.defined()) check_bf16_copy(gate_up_kept, gate_up, op, "gate_up_kept");
  if (y_kept.defined()) check_bf16_copy(y_kept, y, op, "y_kept");
  if constexpr (kCudaBackend) {
    if (!gate_up.is_cpu()) return cuda::swiglu(gate_up, y, gate_up_kept, y_kept);
  }
  cpu::swiglu(gate_up, y, gate_up_kept, y_kept);
}

void swiglu_backward(const Tensor& gate_up, const Tensor& dy, Tensor& dgate_up) {
  const char* op = "swiglu_backward";
  check_float(dy, op, "dy");
  check_kept_anywhere(gate_up, dy, op, "gate_up");
  check_gate_up(gate_up, dy, dy, op, "dy");
  check_kept(dgate_up, dy, op, "dgate_up");
  check_shape(dgate_up, gate_up.shape(), op, "dgate_up");
  check_outputs_apart(op, {{&dgate_up, "dgate_up"}}, {{&gate_up, "gate_up"}, {&dy, "dy"}});
  if constexpr (kCudaBackend) {
    if (!dy.is_cpu()) return cuda::swiglu_backward(gate_up, dy, dgate_up);
  }
  cpu::swiglu_backward(gate_up, dy, dgate_up);
}

}  // namespace lt::kernels
