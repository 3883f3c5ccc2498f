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

void swiglu(const Tensor& gate, const Tensor& up, Tensor& y, const Tensor& gate_kept, const Tensor& up_kept,
            const Tensor& y_kept) {
  const char* op = "swiglu";
  check_float(gate, op, "gate");
  check_same(up, gate, op, "up");
  check_kept_same(y, gate, op, "y");
  for (const auto& [kept, what] :
       {std::pair{&gate_kept, "gate_kept"}, std::pair{&up_kept, "up_kept"}, std::pair{&y_kept, "y_kept"}}) {
    if (!kept->defined()) continue;
    check_bf16_copy(*kept, gate, op, what);
  }
  if constexpr (kCudaBackend) {
    if (!gate.is_cpu()) return cuda::swiglu(gate, up, y, gate_kept, up_kept, y_kept);
  }
  cpu::swiglu(gate, up, y, gate_kept, up_kept, y_kept);
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup) {
  const char* op = "swiglu_backward";
  check_float(dy, op, "dy");
  check_kept_same(gate, dy, op, "gate");
  check_kept_same(up, dy, op, "up");
  check_same(dgate, dy, op, "dgate");
  check_same(dup, dy, op, "dup");
  if constexpr (kCudaBackend) {
    if (!dy.is_cpu()) return cuda::swiglu_backward(gate, up, dy, dgate, dup);
  }
  cpu::swiglu_backward(gate, up, dy, dgate, dup);
}

}  // namespace lt::kernels
