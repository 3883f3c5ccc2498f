#include "autograd/saved.h"

#include "tensor/bf16_shadow.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

bool kept_in_bf16(const Tensor& t) {
  return t.defined() && t.dtype() == DType::F32 &&
         kernels::matmul_precision() == kernels::MatmulPrecision::BF16Inputs &&
         (!t.is_cpu() || kernels::cpu_has_bf16_matmul());
}

// Whether the kernels of t's device write the operands that only GEMMs read rounded to bf16 (a GPU's,
// where each GEMM would otherwise round them in a launch of its own); a CPU's GEMMs round as they pack.
bool gemm_operands_written_in_bf16(const Tensor& t) { return kept_in_bf16(t) && !t.is_cpu(); }

Tensor to_bf16(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::BF16, t.device());
  kernels::convert(t, out);
  return out;
}

// The slot of x's bf16 copy, shared with its reshapes (VariableImpl::saved_bf16).
Tensor& bf16_slot(const Variable& x) {
  VariableImpl& impl = *x.impl();
  if (!impl.saved_bf16) impl.saved_bf16 = std::make_shared<Tensor>();
  return *impl.saved_bf16;
}

bool input_kept_in_bf16(const Variable& x) { return !x.is_leaf() && kept_in_bf16(x.value()); }

}  // namespace

SavedTensor SavedTensor::activation(const Tensor& t) {
  SavedTensor saved;
  saved.widen_ = kept_in_bf16(t);
  saved.stored_ = saved.widen_ ? to_bf16(t) : t;
  return saved;
}

SavedTensor SavedTensor::activation(const Tensor& t, const Tensor& copy) {
  return copy.defined() ? kept_copy(copy) : activation(t);
}

SavedTensor SavedTensor::kept_copy(const Tensor& copy) {
  LT_CHECK(copy.dtype() == DType::BF16, "SavedTensor::kept_copy: ", copy.str(), " is not a bf16 copy");
  SavedTensor saved;
  saved.widen_ = true;
  saved.stored_ = copy;
  return saved;
}

SavedTensor SavedTensor::input(const Variable& x) {
  SavedTensor saved;
  saved.widen_ = input_kept_in_bf16(x);
  if (!saved.widen_) {
    saved.stored_ = x.value();
    return saved;
  }
  Tensor& shared = bf16_slot(x);
  if (!shared.defined()) shared = to_bf16(x.value());
  saved.stored_ = shared.reshape(x.value().shape());
  return saved;
}

Tensor kept_copy_to_fill(const Tensor& t) {
  if (!grad_enabled() || !kept_in_bf16(t)) return Tensor();
  return Tensor::empty(t.shape(), DType::BF16, t.device());
}

Tensor kept_copy_to_fill(const Variable& x) {
  if (!grad_enabled() || !input_kept_in_bf16(x)) return Tensor();
  Tensor& shared = bf16_slot(x);
  if (shared.defined()) return Tensor();
  shared = Tensor::empty(x.value().shape(), DType::BF16, x.value().device());
  return shared;
}

void keep_copy(const Variable& result, const Tensor& copy) {
  // A result without a node (no input needed a gradient) is kept as it is, like a leaf: the copy goes.
  if (!copy.defined() || !input_kept_in_bf16(result)) return;
  LT_CHECK(copy.dtype() == DType::BF16 && copy.shape() == result.value().shape(), "keep_copy: ", copy.str(),
           " is not the kept copy of ", result.value().str());
  bf16_slot(result) = copy;
}

DType gemm_operand_dtype(const Tensor& like) {
  return gemm_operands_written_in_bf16(like) ? DType::BF16 : like.dtype();
}

DType input_gradient_dtype(const Node& node, size_t i, const Tensor& like) {
  return node.gradient_feeds_gemms_only(i) ? gemm_operand_dtype(like) : like.dtype();
}

Tensor gemm_operand(const Tensor& t) { return gemm_operands_written_in_bf16(t) ? to_bf16(t) : t; }

const Tensor& forward_operand(const SavedTensor& saved, const Variable& x) {
  return saved.defined() ? saved.stored() : x.value();
}

Tensor weight_gemm_operand(const Tensor& w) {
  if (!kept_in_bf16(w)) return w;
  const Tensor registered = bf16_shadow_of(w);
  return registered.defined() ? registered : to_bf16(w);
}

Tensor SavedTensor::get() const {
  if (!widen_) return stored_;
  Tensor out = Tensor::empty(stored_.shape(), DType::F32, stored_.device());
  kernels::convert(stored_, out);
  return out;
}

}  // namespace lt
