// The softmax and cross-entropy front doors, and the mean over the targets that take part in a loss.
#include "tensor/dtype_switch.h"
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// x [..., V] with V > 0.
void check_rows(const Tensor& x, const char* op, const char* what) {
  check_float(x, op, what);
  LT_CHECK(x.ndim() >= 1 && x.dim(-1) > 0, op, ": ", what, " must have a non-empty last dimension, got ", x.str());
}

// targets: integer ids of logits' leading shape, each in [0, V) or equal to ignore_index.
void check_targets(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const char* op) {
  check_index(targets, op, "targets");
  check_device(targets, logits, op, "targets");
  check_shape(targets, Shape(logits.shape().begin(), logits.shape().end() - 1), op, "targets");
  const int64_t V = logits.dim(-1);
  const OutOfRange bad = first_out_of_range(targets, IndexRange{V, true, ignore_index});
  LT_CHECK(bad.position < 0, op, ": target id ", bad.value, " (row ", bad.position, ") is outside the vocabulary [0, ",
           V, ")");
}

// count: the one-element i64 tensor of count_targets, on the device of `like`.
void check_count(const Tensor& count, const Tensor& like, const char* op) {
  LT_CHECK(count.defined() && count.dtype() == DType::I64 && count.numel() == 1, op,
           ": count must be one i64 element, got ", count.defined() ? count.str() : "undefined");
  check_device(count, like, op, "count");
}

}  // namespace

void softmax(const Tensor& x, Tensor& y) {
  check_rows(x, "softmax", "x");
  check_same(y, x, "softmax", "y");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::softmax(x, y);
  }
  cpu::softmax(x, y);
}

void log_softmax(const Tensor& x, Tensor& y) {
  check_rows(x, "log_softmax", "x");
  check_same(y, x, "log_softmax", "y");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::log_softmax(x, y);
  }
  cpu::log_softmax(x, y);
}

void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  check_rows(y, "softmax_backward", "y");
  check_same(dy, y, "softmax_backward", "dy");
  check_same(dx, y, "softmax_backward", "dx");
  if constexpr (kCudaBackend) {
    if (!y.is_cpu()) return cuda::softmax_backward(y, dy, dx);
  }
  cpu::softmax_backward(y, dy, dx);
}

void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  check_rows(y, "log_softmax_backward", "y");
  check_same(dy, y, "log_softmax_backward", "dy");
  check_same(dx, y, "log_softmax_backward", "dx");
  if constexpr (kCudaBackend) {
    if (!y.is_cpu()) return cuda::log_softmax_backward(y, dy, dx);
  }
  cpu::log_softmax_backward(y, dy, dx);
}

void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss, Tensor& lse) {
  check_rows(logits, "cross_entropy", "logits");
  check_targets(logits, targets, ignore_index, "cross_entropy");
  check_like(loss, logits, "cross_entropy", "loss");
  check_shape(loss, targets.shape(), "cross_entropy", "loss");
  check_like(lse, logits, "cross_entropy", "lse");
  check_shape(lse, targets.shape(), "cross_entropy", "lse");
  if constexpr (kCudaBackend) {
    if (!logits.is_cpu()) return cuda::cross_entropy(logits, targets, ignore_index, loss, lse);
  }
  cpu::cross_entropy(logits, targets, ignore_index, loss, lse);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse,
                            const Tensor& dloss, Tensor& dlogits) {
  check_rows(logits, "cross_entropy_backward", "logits");
  check_targets(logits, targets, ignore_index, "cross_entropy_backward");
  check_like(lse, logits, "cross_entropy_backward", "lse");
  check_shape(lse, targets.shape(), "cross_entropy_backward", "lse");
  check_like(dloss, logits, "cross_entropy_backward", "dloss");
  check_shape(dloss, targets.shape(), "cross_entropy_backward", "dloss");
  check_same(dlogits, logits, "cross_entropy_backward", "dlogits");
  if constexpr (kCudaBackend) {
    if (!logits.is_cpu()) return cuda::cross_entropy_backward(logits, targets, ignore_index, lse, dloss, dlogits);
  }
  cpu::cross_entropy_backward(logits, targets, ignore_index, lse, dloss, dlogits);
}

void count_targets(const Tensor& targets, int64_t ignore_index, Tensor& count) {
  check_index(targets, "count_targets", "targets");
  check_count(count, targets, "count_targets");
  if constexpr (kCudaBackend) {
    if (!targets.is_cpu()) return cuda::count_targets(targets, ignore_index, count);
  }
  cpu::count_targets(targets, ignore_index, count);
}

void mean_over_count(const Tensor& values, const Tensor& count, Tensor& mean) {
  check_float(values, "mean_over_count", "values");
  check_count(count, values, "mean_over_count");
  check_like(mean, values, "mean_over_count", "mean");
  LT_CHECK(mean.numel() == 1, "mean_over_count: mean must hold one element, got ", mean.str());
  if constexpr (kCudaBackend) {
    if (!values.is_cpu()) return cuda::mean_over_count(values, count, mean);
  }
  cpu::mean_over_count(values, count, mean);
}

void mean_over_count_backward(const Tensor& dmean, const Tensor& count, Tensor& dvalues) {
  check_float(dmean, "mean_over_count_backward", "dmean");
  LT_CHECK(dmean.numel() == 1, "mean_over_count_backward: dmean must hold one element, got ", dmean.str());
  check_count(count, dmean, "mean_over_count_backward");
  check_like(dvalues, dmean, "mean_over_count_backward", "dvalues");
  if constexpr (kCudaBackend) {
    if (!dmean.is_cpu()) return cuda::mean_over_count_backward(dmean, count, dvalues);
  }
  cpu::mean_over_count_backward(dmean, count, dvalues);
}

}  // namespace lt::kernels
