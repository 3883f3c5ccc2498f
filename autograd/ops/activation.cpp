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
  SavedTensor saved_gate, saved_up;
  const char* name() const override { return "swiglu"; }
  // Gate and up as kept: the kernel widens bf16 copies as it reads them.
  std::vector<Tensor> backward(const Tensor& g) override {
    const Tensor &gate = saved_gate.stored(), &up = saved_up.stored();
    // One pass yields both gradients; the one no input needs is dropped.
    Tensor dgate = Tensor::empty_like(g), dup = Tensor::empty_like(g);
    kernels::swiglu_backward(gate, up, g, dgate, dup);
    return {needs_grad(0) ? dgate : Tensor(), needs_grad(1) ? dup : Tensor()};
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

Variable swiglu(const Variable& gate, const Variable& up) {
  LT_PROFILE_SCOPE("swiglu");
  Tensor y = Tensor::empty_like(gate.value());
  // Under mixed precision the kernel writes the bf16 copies that the node keeps, and y's for the down
  // projection that reads y.
  const Tensor gate_kept = kept_copy_to_fill(gate), up_kept = kept_copy_to_fill(up), y_kept = kept_copy_to_fill(y);
  kernels::swiglu(gate.value(), up.value(), y, gate_kept, up_kept, y_kept);
  auto node = std::make_shared<SwigluNode>();
  if (grad_enabled()) {
    node->saved_gate = SavedTensor::input(gate);
    node->saved_up = SavedTensor::input(up);
  }
  Variable result = make_result(y, node, {gate, up});
  keep_copy(result, y_kept);
  return result;
}

}  // namespace lt
