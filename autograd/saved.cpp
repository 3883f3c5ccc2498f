#include "autograd/saved.h"

#include "tensor/kernels.h"

namespace lt {
namespace {

bool kept_in_bf16(const Tensor& t) {
  return t.defined() && !t.is_cpu() && t.dtype() == DType::F32 &&
         kernels::matmul_precision() == kernels::MatmulPrecision::BF16Inputs;
}

Tensor to_bf16(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::BF16, t.device());
  kernels::convert(t, out);
  return out;
}

}  // namespace

SavedTensor SavedTensor::activation(const Tensor& t) {
  SavedTensor saved;
  saved.widen_ = kept_in_bf16(t);
  saved.stored_ = saved.widen_ ? to_bf16(t) : t;
  return saved;
}

SavedTensor SavedTensor::activation(const Tensor& t, const Tensor& copy) {
  if (!copy.defined()) return activation(t);
  SavedTensor saved;
  saved.widen_ = true;
  saved.stored_ = copy;
  return saved;
}

SavedTensor SavedTensor::input(const Variable& x) {
  SavedTensor saved;
  saved.widen_ = !x.is_leaf() && kept_in_bf16(x.value());
  if (!saved.widen_) {
    saved.stored_ = x.value();
    return saved;
  }
  VariableImpl& impl = *x.impl();
  if (!impl.saved_bf16) impl.saved_bf16 = std::make_shared<Tensor>();
  Tensor& shared = *impl.saved_bf16;
  if (!shared.defined()) shared = to_bf16(impl.value);
  saved.stored_ = shared.reshape(impl.value.shape());
  return saved;
}

Tensor kept_copy_to_fill(const Tensor& t) {
  if (!grad_enabled() || !kept_in_bf16(t)) return Tensor();
  return Tensor::empty(t.shape(), DType::BF16, t.device());
}

Tensor kept_copy_to_fill(const Variable& x) {
  if (x.is_leaf()) return Tensor();
  VariableImpl& impl = *x.impl();
  if (impl.saved_bf16 && impl.saved_bf16->defined()) return Tensor();
  Tensor copy = kept_copy_to_fill(impl.value);
  if (!copy.defined()) return copy;
  if (!impl.saved_bf16) impl.saved_bf16 = std::make_shared<Tensor>();
  *impl.saved_bf16 = copy;
  return copy;
}

Tensor gemm_operand(const Tensor& t) { return kept_in_bf16(t) ? to_bf16(t) : t; }

Tensor SavedTensor::get() const {
  if (!widen_) return stored_;
  Tensor out = Tensor::empty(stored_.shape(), DType::F32, stored_.device());
  kernels::convert(stored_, out);
  return out;
}

}  // namespace lt
