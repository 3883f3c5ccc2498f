// silu and swiglu: forward and backward. Each backward is one fused kernel pass (tensor/cpu/activation.cc).
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "autograd/saved.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct SiluNode : Node {
  SavedTensor saved_x;
  const char* name() const override { return "silu"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    const Tensor x = saved_x.get();
    Tensor dx = Tensor::empty_like(x);
    kernels::silu_backward(x, g, dx);
    return {dx};
  }
};

struct SwigluNode : Node {
  SavedTensor saved_gate_up;
  const char* name() const override { return "swiglu"; }
  // gate_up as kept: the kernel widens a bf16 copy as it reads it. The gradient, in one pass, feeds the
  // fused projection's GEMMs: bf16 under mixed precision where only they read it (input_gradient_dtype).
  std::vector<Tensor> backward(const Tensor& g) override {
    const Tensor& gate_up = saved_gate_up.stored();
    Tensor dgate_up = Tensor::empty(gate_up.shape(), input_gradient_dtype(*this, 0, g), g.device());
    kernels::swiglu_backward(gate_up, g, dgate_up);
    return {dgate_up};
  }
};

}  // namespace

Variable silu(const Variable& x) {
  LT_PROFILE_SCOPE("silu");
  Tensor y = Tensor::empty_like(x.value());
  kernels::silu(x.value(), y);
  auto node = std::make_shared<SiluNode>();
  if (grad_enabled()) node->saved_x = SavedTensor::input(x);
  return make_result(y, node, {x});
}

Variable swiglu(const Variable& gate_up) {
  LT_PROFILE_SCOPE("swiglu");
  const Tensor& gu = gate_up.value();
  LT_CHECK(gu.ndim() >= 1 && gu.dim(-1) % 2 == 0, "swiglu: gate_up must end in an even dimension, got ", gu.str());
  Shape y_shape = gu.shape();
  y_shape.back() /= 2;
  Tensor y = Tensor::empty(y_shape, gu.dtype(), gu.device());
  // Under mixed precision the kernel writes the bf16 copy that the node keeps, and y's for the down
  // projection that reads y.
  const Tensor gate_up_kept = kept_copy_to_fill(gate_up), y_kept = kept_copy_to_fill(y);
  kernels::swiglu(gu, y, gate_up_kept, y_kept);
  auto node = std::make_shared<SwigluNode>();
  if (grad_enabled()) node->saved_gate_up = SavedTensor::input(gate_up);
  Variable result = make_result(y, node, {gate_up});
  keep_copy(result, y_kept);
  return result;
}

}  // namespace lt
