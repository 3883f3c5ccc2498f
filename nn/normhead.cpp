// NormHead and the fused head + loss ops: the head's column normalisation, and the chunked pass of the
// rows of h through the head that both fused losses share.
#include "nn/normhead.h"

#include <algorithm>

#include "autograd/profile.h"
#include "autograd/saved.h"
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
// chunk's GEMM into the head's gradient (K = rows) runs near full speed. On a GPU, where each chunk's
// handful of launches costs more than its arithmetic at small V, chunks of up to 128 MiB of logits
// (moe-m's 2,048 tokens in one chunk; Ling-Lite's 126k vocabulary in chunks of 265 rows).
constexpr int64_t kHeadRowsPerChunk = 256;
constexpr int64_t kGpuHeadChunkBytes = int64_t{128} << 20;
}  // namespace

int64_t head_rows_per_chunk(int64_t vocab, DType dtype, bool on_gpu) {
  if (!on_gpu) return kHeadRowsPerChunk;
  const int64_t row_bytes = vocab * static_cast<int64_t>(dtype_size(dtype));
  return std::max(kHeadRowsPerChunk, kGpuHeadChunkBytes / std::max<int64_t>(row_bytes, 1));
}

namespace {
int64_t head_rows_per_chunk(const Tensor& w_VH) {
  return head_rows_per_chunk(w_VH.dim(0), w_VH.dtype(), !w_VH.is_cpu());
}

// One pass of the rows of h [N, H] through the head W [V, H] against targets [N], chunk by chunk. Of the
// outputs below it computes those that are defined.
struct HeadPass {
  Tensor h_NH, w_VH;
  Tensor h_operand_NH;  // h as the GEMMs that read it take it (undefined: h): under mixed precision its kept
                        // bf16 copy (the final norm writes it), which spares rounding h again
  Tensor inv_norm_H;  // 1 / ||W||_col, undefined for HeadNorm::None
  HeadNorm norm = HeadNorm::None;
  Tensor targets_N;
  int64_t ignore_index = 0;
  Tensor row_loss_N;  // the cross-entropy forward: each row's loss, and its log-sum-exp into lse_N
  Tensor lse_N;       // written by the forward, read by the backward
  Tensor dloss_N;     // the cross-entropy backward at these per-row upstream gradients, into:
  Tensor dh_NH;       //   dL/dh
  Tensor dhead_VH;    //   dL/dW' (None, Full) or dL/dW through the detached norm (Detached)
};

void check_head(const Tensor& h, const Tensor& w, const char* op) {
  LT_CHECK(h.ndim() == 2 && w.ndim() == 2 && h.dim(1) == w.dim(1), op, ": h ", h.str(), " and head ", w.str(),
           " do not fit ([N, H] and [V, H])");
}

HeadPass head_pass(const Tensor& h_NH, const Tensor& w_VH, const Tensor& targets_N, int64_t ignore_index,
                   HeadNorm norm) {
  HeadPass pass;
  pass.h_NH = h_NH;
  pass.w_VH = w_VH;
  pass.inv_norm_H = norm == HeadNorm::None ? Tensor() : head_inv_norm(w_VH);
  pass.norm = norm;
  pass.targets_N = targets_N;
  pass.ignore_index = ignore_index;
  return pass;
}

// Per chunk: logits = h' W^T with h' = h, or h / n when the head is normalised (normalising h's columns
// instead of W's gives the same logits, (h / n) W^T = h (W / n)^T, and costs an [N, H] pass instead of
// a [V, H] copy); then the cross-entropy forward; then its backward written over the logits and the
// two products dh = dlogits W' = (dlogits W) / n and dW' = dlogits^T h (through the detached norm,
// dW = dW' / n = dlogits^T (h / n)). Only one chunk of [rows, V] logits ever exists.
void run_head_pass(const HeadPass& p) {
  const Tensor& h = p.h_NH;
  const Tensor& w = p.w_VH;
  const int64_t N = h.dim(0), H = h.dim(1), V = w.dim(0);
  const bool backward = p.dh_NH.defined() || p.dhead_VH.defined();
  Tensor dhead = p.dhead_VH;
  // No rows: no GEMM below overwrites the head's gradient, which is zero.
  if (N == 0 && dhead.defined()) dhead.zero_();
  const int64_t chunk = std::min(N, head_rows_per_chunk(w));
  Tensor logits = Tensor::empty({chunk, V}, w.dtype(), w.device());
  // W as the logits' and dh's products of every chunk take it: rounded once under mixed precision.
  const Tensor w_operand = N > 0 ? weight_gemm_operand(w) : w;
  Tensor scaled_h = p.norm == HeadNorm::None ? Tensor() : Tensor::empty({chunk, H}, h.dtype(), h.device());
  for (int64_t start = 0; start < N; start += chunk) {
    const int64_t rows = std::min(chunk, N - start);
    const Tensor h_c = h.narrow(start, rows), targets_c = p.targets_N.narrow(start, rows);
    const Tensor h_operand_c = p.h_operand_NH.defined() ? p.h_operand_NH.narrow(start, rows) : h_c;
    Tensor logits_c = logits.narrow(0, rows), lse_c = p.lse_N.narrow(start, rows);
    Tensor input_c = h_operand_c;  // what multiplies W^T: h, or h / n
    if (p.norm != HeadNorm::None) {
      Tensor scaled_c = scaled_h.narrow(0, rows);
      kernels::mul(h_c, p.inv_norm_H, scaled_c);
      // Read by the logits' GEMM and, through the detached norm, by the head gradient's: rounded once
      // under mixed precision.
      input_c = gemm_operand(scaled_c);
    }
    kernels::matmul(input_c, false, w_operand, true, logits_c);
    if (p.row_loss_N.defined()) {
      Tensor loss_c = p.row_loss_N.narrow(start, rows);
      kernels::cross_entropy(logits_c, targets_c, p.ignore_index, loss_c, lse_c);
    }
    if (!backward) continue;
    kernels::cross_entropy_backward(logits_c, targets_c, p.ignore_index, lse_c, p.dloss_N.narrow(start, rows),
                                    logits_c);
    // Read by both products: rounded once under mixed precision.
    const Tensor dlogits_c = gemm_operand(logits_c);
    if (p.dh_NH.defined()) {
      Tensor dh_c = p.dh_NH.narrow(start, rows);
      kernels::matmul(dlogits_c, false, w_operand, false, dh_c);
      if (p.norm != HeadNorm::None) kernels::mul(dh_c, p.inv_norm_H, dh_c);
    }
    if (dhead.defined()) {
      const Tensor& rhs = p.norm == HeadNorm::Detached ? input_c : h_operand_c;
      kernels::matmul(dlogits_c, true, rhs, false, dhead, 1.0, start == 0 ? 0.0 : 1.0);
    }
  }
}

// The head's gradient of a pass, scaled by the one-element `upstream` (undefined: 1), as input `input`
// of `node`: through the full Jacobian where the norm has one, then written (or added) straight into
// the leaf's gradient buffer when it has one.
Tensor head_gradient(Node& node, size_t input, const HeadPass& p, const Tensor& upstream) {
  Tensor dhead = p.dhead_VH;
  if (p.norm == HeadNorm::Full) full_normalization_backward(p.w_VH, p.inv_norm_H, dhead);
  GradTarget target = node.grad_target(input, dhead);
  if (!upstream.defined()) {
    if (target.beta == 0) kernels::scale(dhead, 1.0, target.tensor);
    else kernels::axpy(1.0, dhead, target.tensor);
  } else if (target.beta == 0) {
    kernels::scale_by(dhead, upstream, 1.0, target.tensor);
  } else {
    kernels::axpy_by(upstream, 1.0, dhead, target.tensor);
  }
  return target.returned();
}

// The forward already produced both gradients at an upstream gradient of 1 (the loss is a scalar, so
// the backward only has to scale them): nothing of size [N, V] outlives the forward.
struct NormHeadCrossEntropyNode : Node {
  HeadPass pass;  // its dh and dhead hold the gradients at upstream gradient 1
  const char* name() const override { return "normhead_cross_entropy"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dh;
    if (needs_grad(0)) {
      kernels::scale_by(pass.dh_NH, g, 1.0, pass.dh_NH);
      dh = pass.dh_NH;
    }
    Tensor dw;
    if (needs_grad(1)) dw = head_gradient(*this, 1, pass, g);
    return {dh, dw};
  }
};

// The upstream gradient differs per row, so the backward runs the head pass again from the saved
// log-sum-exps, at per-row upstream gradients.
struct NormHeadTokenLogprobsNode : Node {
  HeadPass pass;  // h, W, targets, lse of the forward
  const char* name() const override { return "normhead_token_logprobs"; }
  std::vector<Tensor> backward(const Tensor& g_N) override {
    // out[n] = -(row loss n), so row n's upstream gradient is -g[n].
    HeadPass backward_pass = pass;
    backward_pass.dloss_N = Tensor::empty_like(g_N);
    kernels::scale(g_N, -1.0, backward_pass.dloss_N);
    if (needs_grad(0)) backward_pass.dh_NH = Tensor::empty_like(pass.h_NH);
    if (needs_grad(1)) backward_pass.dhead_VH = Tensor::empty_like(pass.w_VH);
    run_head_pass(backward_pass);
    Tensor dw;
    if (needs_grad(1)) dw = head_gradient(*this, 1, backward_pass, Tensor());
    return {backward_pass.dh_NH, dw};
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
  check_head(h, w, "normhead_cross_entropy");
  LT_CHECK(targets_N.defined() && targets_N.shape() == Shape{h.dim(0)}, "normhead_cross_entropy: targets must be [",
           h.dim(0), "]");
  const int64_t N = h.dim(0);
  HeadPass pass = head_pass(h, w, targets_N, ignore_index, norm);
  pass.row_loss_N = Tensor::empty({N}, h.dtype(), h.device());
  pass.lse_N = Tensor::empty({N}, h.dtype(), h.device());
  // The count stays on the device: the mean and its row weights need no host round trip.
  Tensor count = Tensor::empty({1}, DType::I64, h.device());
  kernels::count_targets(targets_N, ignore_index, count);
  const bool want_dh = grad_enabled() && h_NH.requires_grad();
  const bool want_dw = grad_enabled() && head_VH.requires_grad();
  if (want_dh || want_dw) {
    // Every kept row's loss enters the mean with weight 1 / count (the mean's gradient at 1); with every
    // target ignored the weights are 0 and so are the gradients, so a fully masked batch still
    // back-propagates.
    pass.dloss_N = Tensor::empty({N}, h.dtype(), h.device());
    kernels::mean_over_count_backward(Tensor::full({1}, 1.0, h.dtype(), h.device()), count, pass.dloss_N);
  }
  if (want_dh) pass.dh_NH = Tensor::empty_like(h);
  if (want_dw) pass.dhead_VH = Tensor::empty_like(w);
  // h itself is a GEMM operand without the norm, and of the head gradient's under the full one.
  if (norm == HeadNorm::None || (want_dw && norm == HeadNorm::Full))
    pass.h_operand_NH = SavedTensor::input(h_NH).stored();
  run_head_pass(pass);

  Tensor loss = Tensor::empty({1}, h.dtype(), h.device());
  kernels::mean_over_count(pass.row_loss_N, count, loss);
  auto node = std::make_shared<NormHeadCrossEntropyNode>();
  if (grad_enabled()) {
    // Only what the backward reads: the gradients, and W and 1 / n for the full Jacobian.
    node->pass.norm = norm;
    node->pass.dh_NH = pass.dh_NH;
    node->pass.dhead_VH = pass.dhead_VH;
    if (norm == HeadNorm::Full) {
      node->pass.w_VH = w;
      node->pass.inv_norm_H = pass.inv_norm_H;
    }
  }
  return make_result(loss, node, {h_NH, head_VH});
}

Variable normhead_token_logprobs(const Variable& h_NH, const Variable& head_VH, const Tensor& targets_N,
                                 int64_t ignore_index, HeadNorm norm) {
  LT_PROFILE_SCOPE("normhead_token_logprobs");
  const Tensor& h = h_NH.value();
  const Tensor& w = head_VH.value();
  check_head(h, w, "normhead_token_logprobs");
  LT_CHECK(targets_N.defined() && targets_N.shape() == Shape{h.dim(0)}, "normhead_token_logprobs: targets must be [",
           h.dim(0), "], got ", targets_N.defined() ? targets_N.str() : "undefined");
  const int64_t N = h.dim(0);
  HeadPass pass = head_pass(h, w, targets_N, ignore_index, norm);
  pass.row_loss_N = Tensor::empty({N}, h.dtype(), h.device());
  pass.lse_N = Tensor::empty({N}, h.dtype(), h.device());
  run_head_pass(pass);

  // log p(target) = -(row loss), which is 0 for ignored targets.
  Tensor logprobs_N = Tensor::empty({N}, h.dtype(), h.device());
  kernels::scale(pass.row_loss_N, -1.0, logprobs_N);
  auto node = std::make_shared<NormHeadTokenLogprobsNode>();
  if (grad_enabled()) {
    node->pass = pass;
    node->pass.row_loss_N = Tensor();
  }
  return make_result(logprobs_N, node, {h_NH, head_VH});
}

}  // namespace lt
