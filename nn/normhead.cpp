// NormHead and the fused head + cross-entropy: the head's column normalisation, and the chunked pass of
// the rows of h through the head that never holds more than one chunk of logits.
#include "nn/normhead.h"

#include <algorithm>

#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

constexpr double kNormHeadEps = 1e-7;  // added to the norm, as the Hugging Face code does

// inv_norm [H] = 1 / (||W[:, j]|| + eps).
Tensor head_inv_norm(const Tensor& w_VH) {
  Tensor inv_norm_H = Tensor::empty({w_VH.dim(1)}, w_VH.dtype(), w_VH.device());
  kernels::column_inv_norm(w_VH, kNormHeadEps, inv_norm_H);
  return inv_norm_H;
}

// The full Jacobian of W' = W / n applied to G = dL/dW', in place: G <- (G - W' * sum_v(G * W')) / n
// (the eps in the denominator makes this exact only up to eps / n, far below f32 resolution).
void full_normalization_backward(const Tensor& w_VH, const Tensor& inv_norm_H, Tensor& g_VH) {
  Tensor normalized = Tensor::empty_like(w_VH);
  kernels::mul(w_VH, inv_norm_H, normalized);
  Tensor product = Tensor::empty_like(g_VH);
  kernels::mul(g_VH, normalized, product);
  Tensor proj_H = Tensor::empty_like(inv_norm_H);
  kernels::sum_to(product, proj_H);
  kernels::mul(normalized, proj_H, product);  // W' * sum_v(G W')
  kernels::sub(g_VH, product, g_VH);
  kernels::mul(g_VH, inv_norm_H, g_VH);
}

struct ColumnNormalizeNode : Node {
  Tensor w_VH, inv_norm_H;  // w only for the full Jacobian
  bool detached;
  const char* name() const override { return detached ? "column_normalize(detached)" : "column_normalize(full)"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    // detached: dW = g / n (the norm is a constant).
    Tensor dw = Tensor::empty_like(g);
    if (detached) {
      kernels::mul(g, inv_norm_H, dw);
      return {dw};
    }
    dw.copy_from(g);
    full_normalization_backward(w_VH, inv_norm_H, dw);
    return {dw};
  }
};

// Rows of h per chunk of logits: [256, V] floats at a time instead of [N, V], and enough rows that the
// chunk's GEMM into the head's gradient (K = rows) runs near full speed.
constexpr int64_t kHeadRowsPerChunk = 256;

// The forward already produced both gradients at an upstream gradient of 1 (the loss is a scalar, so
// the backward only has to scale them): nothing of size [N, V] outlives the forward.
struct NormHeadCrossEntropyNode : Node {
  Tensor dh_NH;             // dL/dh
  Tensor dhead_VH;          // dL/dW' (Full and None) or dL/dW through the detached norm (Detached)
  Tensor w_VH, inv_norm_H;  // for the Full Jacobian
  HeadNorm norm;
  const char* name() const override { return "normhead_cross_entropy"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    const double scale = g.item();
    Tensor dh;
    if (needs_grad(0)) {
      kernels::scale(dh_NH, scale, dh_NH);
      dh = dh_NH;
    }
    Tensor dw;
    if (needs_grad(1)) {
      if (norm == HeadNorm::Full) full_normalization_backward(w_VH, inv_norm_H, dhead_VH);
      GradTarget target = grad_target(1, dhead_VH);
      if (target.beta == 0) kernels::scale(dhead_VH, scale, target.tensor);
      else kernels::axpy(scale, dhead_VH, target.tensor);
      dw = target.returned();
    }
    return {dh, dw};
  }
};

}  // namespace

Variable column_normalize(const Variable& w_VH, bool detached) {
  LT_PROFILE_SCOPE(detached ? "column_normalize(detached)" : "column_normalize(full)");
  const Tensor& w = w_VH.value();
  LT_CHECK(w.ndim() == 2, "column_normalize: weight must be [V, H], got ", w.str());
  const Tensor inv_norm_H = head_inv_norm(w);
  Tensor normalized = Tensor::empty_like(w);
  kernels::mul(w, inv_norm_H, normalized);
  auto node = std::make_shared<ColumnNormalizeNode>();
  node->detached = detached;
  node->inv_norm_H = inv_norm_H;
  if (!detached && grad_enabled()) node->w_VH = w;
  return make_result(normalized, node, {w_VH});
}

Variable normhead_cross_entropy(const Variable& h_NH, const Variable& head_VH, const Tensor& targets_N,
                                int64_t ignore_index, HeadNorm norm) {
  LT_PROFILE_SCOPE("normhead_cross_entropy");
  const Tensor& h = h_NH.value();
  const Tensor& w = head_VH.value();
  LT_CHECK(h.ndim() == 2 && w.ndim() == 2 && h.dim(1) == w.dim(1), "normhead_cross_entropy: h ", h.str(),
           " and head ", w.str(), " do not fit ([N, H] and [V, H])");
  LT_CHECK(targets_N.defined() && targets_N.shape() == Shape{h.dim(0)}, "normhead_cross_entropy: targets must be [",
           h.dim(0), "]");
  const int64_t N = h.dim(0), H = h.dim(1), V = w.dim(0);
  // The count stays on the device: the mean and its row weights need no host round trip.
  Tensor count = Tensor::empty({1}, DType::I64, h.device());
  kernels::count_targets(targets_N, ignore_index, count);
  const bool want_dh = grad_enabled() && h_NH.requires_grad();
  const bool want_dw = grad_enabled() && head_VH.requires_grad();

  // Normalising h's columns instead of W's gives the same logits, (h / n) W^T = h (W / n)^T, and
  // costs an [N, H] pass instead of a [V, H] copy.
  const Tensor inv_norm_H = norm == HeadNorm::None ? Tensor() : head_inv_norm(w);
  const int64_t chunk = std::min(N, kHeadRowsPerChunk);
  Tensor logits = Tensor::empty({chunk, V}, w.dtype(), w.device());
  Tensor scaled_h = norm == HeadNorm::None ? Tensor() : Tensor::empty({chunk, H}, h.dtype(), h.device());
  Tensor row_loss = Tensor::empty({N}, h.dtype(), h.device());
  Tensor lse = Tensor::empty({chunk}, h.dtype(), h.device());
  // Every kept row's loss enters the mean with weight 1 / count (the mean's gradient at 1); with every
  // target ignored the weights are 0 and so are the gradients, so a fully masked batch still
  // back-propagates.
  Tensor dloss = Tensor::empty({chunk}, h.dtype(), h.device());
  kernels::mean_over_count_backward(Tensor::full({1}, 1.0, h.dtype(), h.device()), count, dloss);
  auto node = std::make_shared<NormHeadCrossEntropyNode>();
  node->norm = norm;
  if (want_dh) node->dh_NH = Tensor::empty_like(h);
  if (want_dw) node->dhead_VH = Tensor::empty_like(w);
  // No rows: no GEMM below overwrites the head's gradient, which is zero.
  if (want_dw && N == 0) node->dhead_VH.zero_();

  for (int64_t start = 0; start < N; start += chunk) {
    const int64_t rows = std::min(chunk, N - start);
    const Tensor h_c = h.narrow(start, rows), targets_c = targets_N.narrow(start, rows);
    Tensor logits_c = logits.narrow(0, rows), loss_c = row_loss.narrow(start, rows), lse_c = lse.narrow(0, rows);
    Tensor input_c = h_c;  // what multiplies W^T: h, or h / n
    if (norm != HeadNorm::None) {
      input_c = scaled_h.narrow(0, rows);
      kernels::mul(h_c, inv_norm_H, input_c);
    }
    kernels::matmul(input_c, false, w, true, logits_c);
    kernels::cross_entropy(logits_c, targets_c, ignore_index, loss_c, lse_c);
    if (!want_dh && !want_dw) continue;
    // dL/dlogits = (softmax - onehot) / count, written over the logits of this chunk.
    kernels::cross_entropy_backward(logits_c, targets_c, ignore_index, lse_c, dloss.narrow(0, rows), logits_c);
    if (want_dh) {  // dh = dlogits W' = (dlogits W) / n
      Tensor dh_c = node->dh_NH.narrow(start, rows);
      kernels::matmul(logits_c, false, w, false, dh_c);
      if (norm != HeadNorm::None) kernels::mul(dh_c, inv_norm_H, dh_c);
    }
    if (want_dw) {  // dW' = dlogits^T h; through the detached norm dW = dW' / n = dlogits^T (h / n)
      const Tensor& rhs = norm == HeadNorm::Detached ? input_c : h_c;
      kernels::matmul(logits_c, true, rhs, false, node->dhead_VH, 1.0, start == 0 ? 0.0 : 1.0);
    }
  }

  Tensor loss = Tensor::empty({1}, h.dtype(), h.device());
  kernels::mean_over_count(row_loss, count, loss);
  if (norm == HeadNorm::Full && grad_enabled()) {
    node->w_VH = w;
    node->inv_norm_H = inv_norm_H;
  }
  return make_result(loss, node, {h_NH, head_VH});
}

}  // namespace lt
