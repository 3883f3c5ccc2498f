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

Tensor gemm_operand(const Tensor& t) { return kept_in_bf16(t) ? to_bf16(t) : t; }

Tensor SavedTensor::get() const {
  if (!widen_) return stored_;
  Tensor out = Tensor::empty(stored_.shape(), DType::F32, stored_.device());
  kernels::convert(stored_, out);
  return out;
}

}  // namespace lt
