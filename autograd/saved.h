// What a node keeps of a tensor for its backward.
//
// Mixed precision (--dtype bf16, kernels::matmul_precision() == BF16Inputs) keeps every f32 activation in
// bf16, on a GPU and on a CPU with a bf16 GEMM (kernels::cpu_has_bf16_matmul; elsewhere the mode leaves
// the CPU's matmuls f32 and nothing is rounded): the activations the graph holds between the forward and
// the backward are most of a step's transient memory, and this halves them. The backward reads them
// widened back to f32, so every kernel computes in f32 as before; the matmuls round their operands to
// bf16 anyway, so for them nothing changes. Statistics (RMSNorm's rstd, attention's log-sum-exp, softmax
// probabilities) and the loss stay f32, as do weights and other leaves: they live on anyway, and a bf16
// copy would add memory. Without the mode a saved tensor is the tensor itself.
// The kernels that produce the activations write most copies in the same pass (kept_copy_to_fill; the
// rest are rounded when a node keeps them, one vector pass). The GEMMs take a copy as it is (a CPU's
// packing moves its bf16 pairs instead of converting f32); the other backward kernels widen a copy as
// they read it, on either device.
#pragma once
#include "autograd/variable.h"

namespace lt {

class SavedTensor {
 public:
  SavedTensor() = default;
  // A tensor only this node keeps (one it computed): bf16 under the mode.
  static SavedTensor activation(const Tensor& t);
  // The same with the bf16 copy kept_copy_to_fill(t) gave, filled by the kernel that wrote or read t (as
  // activation(t) where `copy` is undefined).
  static SavedTensor activation(const Tensor& t, const Tensor& copy);
  // A bf16 copy that is all the op has of an f32 activation (rows of an input's kept copy that expert
  // parallelism received), held as activation(t, copy) holds a copy.
  static SavedTensor kept_copy(const Tensor& copy);
  // An op's input: a leaf as it is; an intermediate result in bf16 under the mode, converted once and
  // shared by every node that keeps the same Variable or a reshape of it (the normed hidden state
  // feeds the router, the experts and the shared experts' gate and up projections).
  static SavedTensor input(const Variable& x);

  bool defined() const { return stored_.defined(); }
  // The tensor as the forward had it (widened to f32 when kept in bf16).
  Tensor get() const;

  // What is held (bf16 under the mode), for the kernels that take a kept copy as it is (check_kept and
  // check_kept_anywhere in tensor/kernels/dispatch.h: the GEMMs, which would round the widened values to
  // the same bf16 again, and the backward kernels, which widen as they read), and for memory accounting
  // in tests.
  const Tensor& stored() const { return stored_; }

 private:
  Tensor stored_;
  bool widen_ = false;
};

// The bf16 copy that a node keeping x (SavedTensor::input) will hold under mixed precision, allocated and
// registered empty, for a kernel that reads or writes x anyway to fill in the same pass, with no rounding
// pass of its own; undefined where x is kept as it is, where nothing keeps it (no gradients) or where its
// copy exists. The kernel fills it before any node reads it.
Tensor kept_copy_to_fill(const Variable& x);
// The same for a tensor that only the calling node keeps (SavedTensor::activation(t, copy)), or for the
// value of the result an op is about to return, registered with keep_copy once the result exists.
Tensor kept_copy_to_fill(const Tensor& t);
// Registers `copy` (kept_copy_to_fill(result.value()), filled by the kernel that wrote the value) as the
// bf16 copy that the nodes keeping `result` share (SavedTensor::input); nothing where copy is undefined or
// where result is kept as it is (no input needed a gradient).
void keep_copy(const Variable& result, const Tensor& copy);

// The element type of a tensor that only GEMMs will read (an expert's SwiGLU output, the gradients the
// experts' backward feeds to its GEMMs): bf16 under the mode on a GPU where `like` would be kept in bf16,
// written rounded by its producer, which spares the GEMM's rounding pass; else like's dtype.
DType gemm_operand_dtype(const Tensor& like);
// The element type of the gradient node's backward computes for its input i (like: the tensor whose dtype
// it has otherwise): bf16 under the mode where that gradient only feeds GEMMs
// (Node::gradient_feeds_gemms_only), written rounded by the backward's kernel, which spares the rounding
// pass of the GEMMs' node.
DType input_gradient_dtype(const Node& node, size_t i, const Tensor& like);

// A tensor that GEMMs read and nothing keeps (the incoming gradient of a matmul, read by both of its
// products): rounded to bf16 once under the mode on a GPU, where each GEMM would round it again; else
// itself (a CPU's GEMMs round as they pack).
Tensor gemm_operand(const Tensor& t);

// What an op's forward product reads of its input x: x as a node keeps it (`saved`, made before the
// product: under mixed precision the bf16 copy the GEMM would otherwise round again), or x's value where
// nothing keeps it (saved undefined: no gradients).
const Tensor& forward_operand(const SavedTensor& saved, const Variable& x);

// A weight that many GEMMs of one op read (the head's, read by two products in every chunk of rows): under
// the mode where w would be kept in bf16, its registered copy (tensor/bf16_shadow.h: a GPU's training step)
// or else rounded once here, where a CPU's GEMMs would convert it again in every packing; else w itself.
Tensor weight_gemm_operand(const Tensor& w);

}  // namespace lt
