// softmax, log_softmax and the mean cross-entropy loss: forward and backward.
//
// softmax and log_softmax keep their output, from which the backward follows without recomputing
// exp over the row. cross_entropy keeps the logits, each row's log-sum-exp and the number of targets
// that count (a tensor, so nothing is read back to the host); its backward rebuilds softmax(logits) from
// them in one pass.
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
  Tensor count;  // [1] i64: the targets that are not ignored
  int64_t ignore_index;
  const char* name() const override { return "cross_entropy"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    // loss = sum(row losses) / count, so every row receives g / count (0 when every target is ignored,
    // and the kernel writes zero rows for ignored targets anyway).
    Tensor dloss = Tensor::empty(targets.shape(), logits.dtype(), logits.device());
    kernels::mean_over_count_backward(g, count, dloss);
    Tensor dlogits = Tensor::empty_like(logits);
    kernels::cross_entropy_backward(logits, targets, ignore_index, lse, dloss, dlogits);
    return {dlogits};
  }
};

}  // namespace

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

  // The count stays a tensor on the logits' device: forming the mean needs no host round trip. Every
  // target ignored gives loss 0 and a zero gradient, so a fully masked batch still back-propagates.
  Tensor count = Tensor::empty({1}, DType::I64, lv.device());
  kernels::count_targets(targets, ignore_index, count);
  Tensor loss = Tensor::empty({1}, lv.dtype(), lv.device());
  kernels::mean_over_count(row_loss, count, loss);
  auto node = std::make_shared<CrossEntropyNode>();
  node->ignore_index = ignore_index;
  if (grad_enabled()) {
    node->logits = lv;
    node->targets = targets;
    node->lse = lse;
    node->count = count;
  }
  return make_result(loss, node, {logits});
}

}  // namespace lt
