// What a node keeps of a tensor for its backward.
//
// Mixed precision (--dtype bf16 on a GPU, kernels::matmul_precision() == BF16Inputs) keeps every f32
// activation on a GPU in bf16: the activations the graph holds between the forward and the backward
// are most of a step's memory, and this halves them. The backward reads them widened back to f32, so
// every kernel computes in f32 as before; the matmuls round their operands to bf16 anyway, so for them
// nothing changes. Statistics (RMSNorm's rstd, attention's log-sum-exp, softmax probabilities) and the
// loss stay f32, as do weights and other leaves: they live on anyway, and a bf16 copy would add memory.
// On the CPU, and without the mode, a saved tensor is the tensor itself: the CPU's bf16 GEMM
// (tensor/cpu/gemm.cc) rounds while packing, and a bf16 copy of every activation would add a pass over
// memory per activation to a step whose memory-bound ops already take a fifth of its time.
#pragma once
#include "autograd/variable.h"

namespace lt {

class SavedTensor {
 public:
  SavedTensor() = default;
  // A tensor only this node keeps (one it computed): bf16 under the mode.
  static SavedTensor activation(const Tensor& t);
  // An op's input: a leaf as it is; an intermediate result in bf16 under the mode, converted once and
  // shared by every node that keeps the same Variable or a reshape of it (the normed hidden state
  // feeds the router, the experts and the shared experts' gate and up projections).
  static SavedTensor input(const Variable& x);

  // The bf16 copy that input(x) will keep and share, where no node has made it yet: uninitialised, now x's
  // copy, for the kernel that reads or writes x to fill in the same pass (before any node reads it),
  // which spares a rounding pass of its own. Undefined where x is kept as it is, or its copy exists.
  static Tensor bf16_copy_to_write(const Variable& x);

  bool defined() const { return stored_.defined(); }
  // The tensor as the forward had it (widened to f32 when kept in bf16).
  Tensor get() const;

  // What is held (bf16 under the mode), for the kernels that take a kept copy as it is (check_kept in
  // tensor/kernels/dispatch.h: the GEMMs, which would round the widened values to the same bf16 again,
  // and backward kernels that widen as they read), and for memory accounting in tests.
  const Tensor& stored() const { return stored_; }

 private:
  Tensor stored_;
  bool widen_ = false;
};

// A tensor that GEMMs read and nothing keeps (the incoming gradient of a matmul, read by both of its
// products): rounded to bf16 once under the mode, where each GEMM would round it again; else itself.
Tensor gemm_operand(const Tensor& t);

}  // namespace lt
