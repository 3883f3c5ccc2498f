#include "autograd/variable.h"

#include <unordered_map>

#include "tensor/kernels.h"

namespace lt {

namespace {
thread_local bool grad_mode = true;
}

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
  node->inputs = std::move(inputs);
  out.impl_->requires_grad = true;
  out.impl_->grad_fn = std::move(node);
  return out;
}

void Variable::backward() const {
  LT_CHECK(impl_->value.numel() == 1, "backward() without a seed needs a scalar, got ", impl_->value.str());
  backward(Tensor::full(impl_->value.shape(), 1.0, impl_->value.dtype(), impl_->value.device()));
}

namespace {
// Gradients returned by a backward may alias each other (add hands its incoming gradient to both
// inputs), so a pending gradient is never changed in place: a second contribution makes a new sum.
void accumulate_pending(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) {
    slot = g;
    return;
  }
  Tensor sum = Tensor::empty(slot.shape(), slot.dtype(), slot.device());
  kernels::add(slot, g, sum);
  slot = sum;
}
// A leaf owns its gradient storage (an optimiser may scale it in place), and accumulates into it
// across backward calls (gradient accumulation over micro-batches).
void accumulate_leaf(Tensor& slot, const Tensor& g) {
  if (!slot.defined()) slot = g.clone();
  else kernels::axpy(1.0, g, slot);
}
}  // namespace

void Variable::backward(const Tensor& seed_grad) const {
  LT_CHECK(requires_grad(), "backward() on a value that does not require grad");
  LT_CHECK(seed_grad.shape() == impl_->value.shape(), "backward seed ", seed_grad.str(), " for value ",
           impl_->value.str());

  // Reverse topological order by iterative depth-first search over the nodes.
  std::vector<VariableImpl*> order;
  std::unordered_map<VariableImpl*, bool> visited;
  std::vector<std::pair<VariableImpl*, size_t>> stack{{impl_.get(), 0}};
  visited[impl_.get()] = true;
  while (!stack.empty()) {
    auto& [var, next_input] = stack.back();
    Node* node = var->grad_fn.get();
    if (node != nullptr && next_input < node->inputs.size()) {
      VariableImpl* in = node->inputs[next_input++].impl();
      if (in->requires_grad && !visited[in]) {
        visited[in] = true;
        stack.push_back({in, 0});
      }
      continue;
    }
    order.push_back(var);
    stack.pop_back();
  }

  // Gradients of non-leaf values. Each entry also holds its Variable: once the nodes that used a value
  // have run and been freed, the entry may be the last owner of that value, and it must stay alive
  // until its own node has run (`order` holds only raw pointers).
  std::unordered_map<VariableImpl*, std::pair<Variable, Tensor>> pending;
  pending[impl_.get()] = {*this, seed_grad};
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    VariableImpl* var = *it;
    auto found = pending.find(var);
    if (found == pending.end()) continue;  // reached no gradient (e.g. only through integer paths)
    const Variable owner = std::move(found->second.first);
    Tensor grad = std::move(found->second.second);
    pending.erase(found);
    if (var->grad_fn == nullptr) {  // a leaf
      accumulate_leaf(var->grad, grad);
      continue;
    }
    std::shared_ptr<Node> node = std::move(var->grad_fn);  // frees this part of the graph below
    std::vector<Tensor> input_grads = node->backward(grad);
    LT_CHECK(input_grads.size() == node->inputs.size(), node->name(), " backward returned ", input_grads.size(),
             " gradients for ", node->inputs.size(), " inputs");
    for (size_t i = 0; i < input_grads.size(); ++i) {
      VariableImpl* in = node->inputs[i].impl();
      if (!in->requires_grad || !input_grads[i].defined()) continue;
      LT_CHECK(input_grads[i].shape() == in->value.shape(), node->name(), " backward: gradient ",
               input_grads[i].str(), " for input ", i, " of shape ", shape_str(in->value.shape()));
      if (in->grad_fn == nullptr) {
        accumulate_leaf(in->grad, input_grads[i]);
        continue;
      }
      auto& [in_owner, in_grad] = pending[in];
      in_owner = node->inputs[i];
      accumulate_pending(in_grad, input_grads[i]);
    }
  }
}

}  // namespace lt
