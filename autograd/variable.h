// The autograd core: a define-by-run graph.
//
// A Variable is a tensor value plus, for a leaf, its gradient. An op that sees an input requiring a
// gradient records a Node that keeps what its backward needs and one edge per input: the input's own
// node, or the input itself when it is a leaf. Edges hold no values, so an intermediate result lives
// only as long as a Variable or a node's saved tensors hold it: the graph keeps exactly the activations
// the backwards need. backward() walks the nodes in reverse topological order, sums the gradient
// reaching each node over all its uses, accumulates the gradients of the leaves, and drops every node
// it passed, so the graph (and the activations it holds) is freed as soon as its gradients exist.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace lt {

class Node;

struct VariableImpl {
  Tensor value;
  Tensor grad;  // leaves that require grad: the sum over backward calls since zero_grad (undefined before)
  // Storage a leaf keeps for its gradient across zero_grad (a view into one flat buffer of all
  // gradients): gradients are then written or added straight into it, never cloned or reallocated.
  Tensor grad_buffer;
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves and for results computed without grad
  // The value in bf16 as the nodes that use it keep it under mixed precision (autograd/saved.h), made
  // by the first of them. One slot for a value and its reshapes (the views every Linear takes), so the
  // projections that read one activation share one copy.
  std::shared_ptr<Tensor> saved_bf16;
};

class Variable {
 public:
  Variable() = default;
  explicit Variable(Tensor value, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const { return impl_->value; }
  Tensor& value() { return impl_->value; }
  const Tensor& grad() const { return impl_->grad; }
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }
  const Shape& shape() const { return impl_->value.shape(); }
  int64_t dim(int axis) const { return impl_->value.dim(axis); }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  VariableImpl* impl() const { return impl_.get(); }

  void set_requires_grad(bool flag) { impl_->requires_grad = flag; }
  // The gradient becomes undefined again; a preallocated buffer is kept (its stale contents are
  // overwritten by the next gradient, so nothing is zeroed).
  void zero_grad() { impl_->grad = Tensor(); }
  // Gives this leaf preallocated gradient storage of its value's shape and dtype; a gradient it holds
  // now is moved there.
  void set_grad_buffer(Tensor buffer);
  // A new leaf holding the same value, cut from the graph.
  Variable detach() const { return Variable(impl_->value, false); }

  // Back-propagates from this scalar (seed gradient 1), or from any shape with an explicit seed.
  void backward() const;
  void backward(const Tensor& seed_grad) const;

 private:
  friend Variable make_result(Tensor, std::shared_ptr<Node>, std::vector<Variable>);
  std::shared_ptr<VariableImpl> impl_;
};

// Where a backward writes the gradient of one input (Node::grad_target).
struct GradTarget {
  Tensor tensor;          // the leaf's own gradient storage, the pending gradient of an intermediate
                          // result, or a new tensor of the input's shape
  double beta = 0;        // 0: overwrite tensor, 1: add to what it holds (as a GEMM's beta)
  bool in_place = false;  // tensor is where the engine keeps this gradient: the backward returns nothing
                          // for this input
  // What the backward returns for this input once it has written tensor.
  Tensor returned() const { return in_place ? Tensor() : tensor; }
};

// One recorded op. Subclasses keep what backward needs and return one gradient per input, in input
// order (an undefined Tensor where an input needs none, or where the gradient was written in place).
class Node {
 public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  virtual std::vector<Tensor> backward(const Tensor& grad_out) = 0;

  // Which inputs need a gradient, so a backward can skip work.
  bool needs_grad(size_t i) const { return edges_[i].node != nullptr || edges_[i].leaf != nullptr; }
  // For a backward whose kernel can write or accumulate its result anywhere (a GEMM with beta, a
  // scatter-add, RMSNorm's dx): input i's preallocated leaf gradient when it has one, so the gradient
  // never exists twice; for an intermediate result whose gradient already holds another use's
  // contribution (a residual stream), that pending gradient with beta 1, so the sum costs no pass of its
  // own; else a new uninitialised tensor of that shape. Write the target of one input before asking
  // for the next: an input used twice gets beta 1 the second time.
  GradTarget grad_target(size_t i, const Shape& shape, DType dtype, Device device);
  GradTarget grad_target(size_t i, const Tensor& like) {
    return grad_target(i, like.shape(), like.dtype(), like.device());
  }
  // Whether this backward reads its incoming gradient only as a GEMM operand (a matmul's two products), so
  // that under mixed precision the gradient may reach it already rounded to bf16.
  virtual bool reads_gradient_in_gemms_only() const { return false; }
  // Whether the gradient this backward returns for input i reaches that input's node as it is and is only
  // a GEMM operand there: the node reads its gradient in GEMMs only, and its result has no other use in
  // the graph being differentiated (no sum with another contribution). Under mixed precision such a
  // gradient may be written in bf16 (autograd/saved.h: input_gradient_dtype).
  bool gradient_feeds_gemms_only(size_t i) const;

 private:
  friend class Variable;
  friend Variable make_result(Tensor, std::shared_ptr<Node>, std::vector<Variable>);
  struct Edge {
    std::shared_ptr<Node> node;          // the input's own node (the input is an intermediate result)
    std::shared_ptr<VariableImpl> leaf;  // or the input itself (a leaf); neither: it needs no gradient
  };
  std::vector<Edge> edges_;
  Shape output_shape_;                  // the shape every gradient flowing into this node must have
  std::weak_ptr<VariableImpl> output_;  // the result, cut from the graph once this node has run
};

// While a LeafGradientsReady lives on this thread, each backward calls `ready` with every leaf it reaches
// as soon as that leaf's gradient from this backward is complete: the last node with an edge to the leaf
// has run (its kernels queued, on a GPU). A data-parallel reduction may then start on that gradient while
// the rest of the backward runs (dist/data_parallel.h). A leaf whose nodes get no gradient is never named.
class LeafGradientsReady {
 public:
  using Callback = std::function<void(const VariableImpl& leaf)>;
  explicit LeafGradientsReady(Callback ready);
  ~LeafGradientsReady();
  LeafGradientsReady(const LeafGradientsReady&) = delete;
  LeafGradientsReady& operator=(const LeafGradientsReady&) = delete;

 private:
  Callback ready_;
  const Callback* previous_;
};

// Grad mode: while a NoGradGuard lives on this thread, ops record nothing.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Wraps an op's output: records `node` (with edges to `inputs`) when grad mode is on and an input
// requires grad; otherwise the node is dropped and the result is a plain value.
Variable make_result(Tensor value, std::shared_ptr<Node> node, std::vector<Variable> inputs);

}  // namespace lt
