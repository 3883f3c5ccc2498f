#include "autograd/variable.h"

#include <unordered_map>
#include <unordered_set>

#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {

namespace {
thread_local bool grad_mode = true;

// The gradient of each node's result still being summed over its uses, keyed by the node. Each entry also
// owns its node (Variable::backward).
using PendingGrads = std::unordered_map<Node*, std::pair<std::shared_ptr<Node>, Tensor>>;
// Those of the backward running on this thread, for Node::grad_target.
thread_local PendingGrads* running_pending = nullptr;
// How many nodes of the graph that backward differentiates use each node's result, for
// Node::gradient_feeds_gemms_only.
using Uses = std::unordered_map<const Node*, int>;
thread_local const Uses* running_uses = nullptr;
// The innermost LeafGradientsReady of this thread, or null.
thread_local const LeafGradientsReady::Callback* leaf_ready = nullptr;
}  // namespace

LeafGradientsReady::LeafGradientsReady(Callback ready) : ready_(std::move(ready)), previous_(leaf_ready) {
  leaf_ready = &ready_;
}
LeafGradientsReady::~LeafGradientsReady() { leaf_ready = previous_; }

bool grad_enabled() { return grad_mode; }
NoGradGuard::NoGradGuard() : previous_(grad_mode) { grad_mode = false; }
NoGradGuard::~NoGradGuard() { grad_mode = previous_; }

Variable::Variable(Tensor value, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  impl_->value = std::move(value);
  impl_->requires_grad = requires_grad;
}

Variable make_result(Tensor value, std::shared_ptr<Node> node, std::vector<Variable> inputs) {
  Variable out(std::move(value), false);
  if (!grad_mode) return out;
  bool any = false;
  for (const Variable& in : inputs) any = any || in.requires_grad();
  if (!any) return out;
  node->edges_.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::shared_ptr<VariableImpl>& in = inputs[i].impl_;
    if (!in || !in->requires_grad) continue;
    if (in->grad_fn) node->edges_[i].node = in->grad_fn;
    else node->edges_[i].leaf = in;
  }
  node->output_shape_ = out.impl_->value.shape();
  node->output_ = out.impl_;
  out.impl_->requires_grad = true;
  out.impl_->grad_fn = std::move(node);
  return out;
}

void Variable::set_grad_buffer(Tensor buffer) {
  LT_CHECK(is_leaf(), "set_grad_buffer: only a leaf owns its gradient");
  LT_CHECK(buffer.shape() == impl_->value.shape() && buffer.dtype() == impl_->value.dtype() &&
               buffer.device() == impl_->value.device(),
           "set_grad_buffer: buffer ", buffer.str(), " for value ", impl_->value.str());
  if (impl_->grad.defined()) {
    buffer.copy_from(impl_->grad);
    impl_->grad = buffer;
  }
  impl_->grad_buffer = std::move(buffer);
}

GradTarget Node::grad_target(size_t i, const Shape& shape, DType dtype, Device device) {
  // An intermediate result whose gradient already holds an earlier contribution: add to it, as the engine
  // would after this backward, unless another tensor holds its storage (gradients may alias, and the
  // incoming gradient or a saved input may be that storage). The sum has the bits of the engine's: one
  // addition of this contribution, once rounded, to the pending gradient.
  if (Node* producer = edges_[i].node.get(); producer != nullptr && running_pending != nullptr) {
    if (const auto found = running_pending->find(producer); found != running_pending->end()) {
      const Tensor& pending = found->second.second;
      if (pending.defined() && pending.sole_owner() && pending.shape() == shape && pending.dtype() == dtype &&
          pending.device() == device)
        return {pending, 1.0, true};
    }
  }
  VariableImpl* leaf = edges_[i].leaf.get();
  if (leaf == nullptr || !leaf->grad_buffer.defined()) return {Tensor::empty(shape, dtype, device), 0.0, false};
  LT_CHECK(leaf->grad_buffer.shape() == shape, name(), " backward: gradient of shape ", shape_str(shape),
           " for a leaf of shape ", shape_str(leaf->grad_buffer.shape()));
  const double beta = leaf->grad.defined() ? 1.0 : 0.0;
  leaf->grad = leaf->grad_buffer;
  return {leaf->grad, beta, true};
}

bool Node::gradient_feeds_gemms_only(size_t i) const {
  const Node* producer = edges_[i].node.get();
  if (producer == nullptr || running_uses == nullptr || !producer->reads_gradient_in_gemms_only()) return false;
  const auto found = running_uses->find(producer);
  return found != running_uses->end() && found->second == 1;
}

void Variable::backward() const {
  LT_CHECK(impl_->value.numel() == 1, "backward() without a seed needs a scalar, got ", impl_->value.str());
  backward(Tensor::full(impl_->value.shape(), 1.0, impl_->value.dtype(), impl_->value.device()));
}

namespace {
// Gradients returned by a backward may alias each other (add hands its incoming gradient to both
// inputs), so a pending gradient is summed in place only when no other tensor holds its storage;
// otherwise a second contribution makes a new sum. (In place, the sum writes lines it has just read
// rather than a fresh buffer's: the residual stream's sums of a moe-m step took 8.5 ms, not 11-13.)
void accumulate_pending(Tensor& slot, const Tensor& g) {
  LT_PROFILE_PHASE_SCOPE("accumulate_grad", profile::Phase::Backward);
  if (!slot.defined()) {
    slot = g;
    return;
  }
  if (slot.sole_owner() && !slot.shares_storage(g)) {
    kernels::axpy(1.0, g, slot);
    return;
  }
  Tensor sum = Tensor::empty(slot.shape(), slot.dtype(), slot.device());
  kernels::add(slot, g, sum);
  slot = sum;
}
// A leaf owns its gradient storage (an optimiser may scale it in place) and accumulates into it across
// backward calls (gradient accumulation over micro-batches). The first gradient since zero_grad goes
// into the leaf's preallocated buffer when it has one, else into a copy.
void accumulate_leaf(VariableImpl& leaf, const Tensor& g) {
  LT_PROFILE_PHASE_SCOPE("accumulate_grad", profile::Phase::Backward);
  if (leaf.grad.defined()) {
    kernels::axpy(1.0, g, leaf.grad);
  } else if (leaf.grad_buffer.defined()) {
    leaf.grad = leaf.grad_buffer;
    leaf.grad.copy_from(g);
  } else {
    leaf.grad = g.clone();
  }
}
}  // namespace

void Variable::backward(const Tensor& seed_grad) const {
  // Self time: the graph walk and bookkeeping, apart from the nodes' backwards timed below.
  LT_PROFILE_PHASE_SCOPE("autograd_engine", profile::Phase::Backward);
  LT_CHECK(requires_grad(), "backward() on a value that does not require grad");
  LT_CHECK(seed_grad.shape() == impl_->value.shape(), "backward seed ", seed_grad.str(), " for value ",
           impl_->value.str());

  if (impl_->grad_fn == nullptr) {  // backward from a leaf: the seed is its gradient
    accumulate_leaf(*impl_, seed_grad);
    if (leaf_ready != nullptr) (*leaf_ready)(*impl_);
    return;
  }

  // Reverse topological order by iterative depth-first search over the nodes.
  Node* const root = impl_->grad_fn.get();
  // Each node's edges are walked once, so the walk also counts the uses of every result.
  std::vector<Node*> order;
  std::unordered_set<Node*> visited{root};
  Uses uses;
  // With a LeafGradientsReady listening, the edges to each leaf still to run.
  std::unordered_map<const VariableImpl*, int> leaf_edges_left;
  std::vector<std::pair<Node*, size_t>> stack{{root, 0}};
  while (!stack.empty()) {
    auto& [node, next_edge] = stack.back();
    if (next_edge < node->edges_.size()) {
      const Node::Edge& edge = node->edges_[next_edge++];
      Node* in = edge.node.get();
      if (leaf_ready != nullptr && edge.leaf != nullptr) ++leaf_edges_left[edge.leaf.get()];
      if (in != nullptr) ++uses[in];
      if (in != nullptr && visited.insert(in).second) stack.push_back({in, 0});
      continue;
    }
    order.push_back(node);
    stack.pop_back();
  }

  // The gradient of each node's result, summed over its uses. Each entry also owns its node: once the
  // nodes that used a result have run and been freed, the entry may be the last owner of its node,
  // which must stay alive until it has run (`order` holds only raw pointers). A backward may add its
  // contribution straight into an entry (Node::grad_target) and return none for that input.
  PendingGrads pending;
  pending[root] = {impl_->grad_fn, seed_grad};
  struct RunningPending {
    PendingGrads* outer = running_pending;
    const Uses* outer_uses = running_uses;
    RunningPending(PendingGrads* now, const Uses* now_uses) {
      running_pending = now;
      running_uses = now_uses;
    }
    ~RunningPending() {
      running_pending = outer;
      running_uses = outer_uses;
    }
  } running(&pending, &uses);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    auto found = pending.find(*it);
    if (found == pending.end()) continue;  // reached no gradient (e.g. only through integer paths)
    const std::shared_ptr<Node> node = std::move(found->second.first);  // freed with this iteration
    const Tensor grad = std::move(found->second.second);
    pending.erase(found);
    if (const std::shared_ptr<VariableImpl> result = node->output_.lock()) result->grad_fn.reset();
    std::vector<Tensor> input_grads;
    {
      profile::Scope timed(node->name(), profile::Phase::Backward);
      input_grads = node->backward(grad);
    }
    LT_CHECK(input_grads.size() == node->edges_.size(), node->name(), " backward returned ", input_grads.size(),
             " gradients for ", node->edges_.size(), " inputs");
    for (size_t i = 0; i < input_grads.size(); ++i) {
      const Node::Edge& edge = node->edges_[i];
      if (!input_grads[i].defined() || (edge.node == nullptr && edge.leaf == nullptr)) continue;
      const Shape& expected = edge.node ? edge.node->output_shape_ : edge.leaf->value.shape();
      LT_CHECK(input_grads[i].shape() == expected, node->name(), " backward: gradient ", input_grads[i].str(),
               " for input ", i, " of shape ", shape_str(expected));
      if (edge.leaf) {
        accumulate_leaf(*edge.leaf, input_grads[i]);
        continue;
      }
      auto& [owner, pending_grad] = pending[edge.node.get()];
      owner = edge.node;
      accumulate_pending(pending_grad, input_grads[i]);
    }
    // A gradient written in place (grad_target) counts as well as one returned: the node has run.
    if (leaf_ready != nullptr)
      for (const Node::Edge& edge : node->edges_)
        if (edge.leaf != nullptr && --leaf_edges_left[edge.leaf.get()] == 0) (*leaf_ready)(*edge.leaf);
  }
}

}  // namespace lt
