// The autograd core: a define-by-run graph.
//
// A Variable is a tensor value plus, once backward has run, its gradient. An op that sees an input
// requiring a gradient records a Node that keeps what its backward needs and points at its inputs.
// backward() walks the nodes in reverse topological order, sums the gradient of each Variable over all
// its uses, stores it in the leaves, and drops every node it passed, so the graph (and the activations
// it holds) is freed as soon as its gradients have been produced.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace lt {

class Node;

struct VariableImpl {
  Tensor value;
  Tensor grad;                     // defined after backward for leaves that require grad
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;   // null for leaves and for results computed without grad
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
  void zero_grad() { impl_->grad = Tensor(); }
  // A new leaf holding the same value, cut from the graph.
  Variable detach() const { return Variable(impl_->value, false); }

  // Back-propagates from this scalar (seed gradient 1), or from any shape with an explicit seed.
  void backward() const;
  void backward(const Tensor& seed_grad) const;

 private:
  friend Variable make_result(Tensor, std::shared_ptr<Node>, std::vector<Variable>);
  std::shared_ptr<VariableImpl> impl_;
};

// One recorded op. Subclasses keep what backward needs and return one gradient per input, in input
// order (an undefined Tensor where an input needs none).
class Node {
 public:
  virtual ~Node() = default;
  virtual const char* name() const = 0;
  virtual std::vector<Tensor> backward(const Tensor& grad_out) = 0;

  std::vector<Variable> inputs;
  // Which inputs need a gradient, so a backward can skip work.
  bool needs_grad(size_t i) const { return inputs[i].requires_grad(); }
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

// Wraps an op's output: records `node` (with `inputs`) when grad mode is on and an input requires
// grad; otherwise the node is dropped and the result is a plain value.
Variable make_result(Tensor value, std::shared_ptr<Node> node, std::vector<Variable> inputs);

}  // namespace lt
