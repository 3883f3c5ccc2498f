// softmax, log_softmax and the mean cross-entropy loss: forward and backward.
//
// softmax and log_softmax keep their output, from which the backward follows without recomputing
// exp over the row. cross_entropy keeps the logits and each row's log-sum-exp; its backward rebuilds
// softmax(logits) from them in one pass.
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct SoftmaxNode : Node {
  Tensor y;
  bool log;  // log_softmax
  const char* name() const override { return log ? "log_softmax" : "softmax"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dx = Tensor::empty_like(y);
    if (log) kernels::log_softmax_backward(y, g, dx);
    else kernels::softmax_backward(y, g, dx);
    return {dx};
  }
};

Variable softmax_op(const Variable& x, bool log) {
  LT_PROFILE_SCOPE(log ? "log_softmax" : "softmax");
  Tensor y = Tensor::empty_like(x.value());
  if (log) kernels::log_softmax(x.value(), y);
  else kernels::softmax(x.value(), y);
  auto node = std::make_shared<SoftmaxNode>();
  node->log = log;
  if (grad_enabled()) node->y = y;
  return make_result(y, node, {x});
}

struct CrossEntropyNode : Node {
  Tensor logits, targets, lse;
  int64_t ignore_index;
  int64_t count;  // targets not ignored
  const char* name() const override { return "cross_entropy"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    if (count == 0) return {Tensor::zeros_like(logits)};
    // loss = sum(row losses) / count, so every row receives g / count.
    const Tensor dloss = Tensor::full(targets.shape(), g.item() / static_cast<double>(count), logits.dtype(),
                                      logits.device());
    Tensor dlogits = Tensor::empty_like(logits);
    kernels::cross_entropy_backward(logits, targets, ignore_index, lse, dloss, dlogits);
    return {dlogits};
  }
};

}  // namespace

int64_t count_targets(const Tensor& targets, int64_t ignore_index) {
  int64_t count = 0;
  if (targets.dtype() == DType::I32) {
    const int32_t* ids = targets.data<int32_t>();
    for (int64_t n = 0; n < targets.numel(); ++n) count += ids[n] != ignore_index;
  } else {
    const int64_t* ids = targets.data<int64_t>();
    for (int64_t n = 0; n < targets.numel(); ++n) count += ids[n] != ignore_index;
  }
  return count;
}

Variable softmax(const Variable& x) { return softmax_op(x, false); }
Variable log_softmax(const Variable& x) { return softmax_op(x, true); }

Variable cross_entropy(const Variable& logits, const Tensor& targets, int64_t ignore_index) {
  LT_PROFILE_SCOPE("cross_entropy");
  const Tensor& lv = logits.value();
  LT_CHECK(lv.ndim() >= 1, "cross_entropy: logits must have at least one dimension, got ", lv.str());
  LT_CHECK(targets.defined(), "cross_entropy: targets are undefined");
  Tensor row_loss = Tensor::empty(targets.shape(), lv.dtype(), lv.device());
  Tensor lse = Tensor::empty(targets.shape(), lv.dtype(), lv.device());
  kernels::cross_entropy(lv, targets, ignore_index, row_loss, lse);  // checks targets (dtype, range, cpu)

  // Every target ignored: loss 0 and a zero gradient, so a fully masked batch still back-propagates.
  const int64_t count = count_targets(targets, ignore_index);
  Tensor loss = Tensor::zeros({1}, lv.dtype(), lv.device());
  if (count > 0) {
    kernels::sum(row_loss, loss);
    kernels::scale(loss, 1.0 / static_cast<double>(count), loss);
  }
  auto node = std::make_shared<CrossEntropyNode>();
  node->ignore_index = ignore_index;
  node->count = count;
  if (grad_enabled()) {
    node->logits = lv;
    node->targets = targets;
    node->lse = lse;
  }
  return make_result(loss, node, {logits});
}

}  // namespace lt
