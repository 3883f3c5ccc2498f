// attention: causal grouped-query scaled-dot-product attention, forward and backward.
//
// q [B, T, Hq, D], k and v [B, T, Hkv, D] -> out [B, T, Hq, D], scores scaled by 1/sqrt(D) as in Ling.
// The kernels are flash-style (tensor/cpu/attention.cc): the forward keeps only out and the per-row
// log-sum-exp lse [B, Hq, T], and the backward recomputes the probabilities from them, so the node
// holds O(T) extra memory per head instead of the T x T attention matrix. With doc_start (packed
// documents, tensor/kernels.h) each query sees only the keys of its own document.
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "autograd/ops.h"
#include "autograd/profile.h"
#include "autograd/saved.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

// Whether the tensors are all held as one element type (all kept in bf16, or all as they are).
bool same_kept_dtype(std::initializer_list<const SavedTensor*> saved) {
  const DType first = (*saved.begin())->stored().dtype();
  return std::all_of(saved.begin(), saved.end(),
                     [first](const SavedTensor* t) { return t->stored().dtype() == first; });
}

// q, k, v and out are activations (bf16 under mixed precision, autograd/saved.h); the log-sum-exp is
// a softmax statistic and stays f32.
struct AttentionNode : Node {
  SavedTensor saved_q, saved_k, saved_v, saved_out;
  Tensor lse, doc_start;
  double scale = 0;
  const char* name() const override { return "attention"; }

  // dq, dk and dv come out of one pass over the blocks, so all three are computed even when an input
  // needs no gradient. q, k, v and out as kept: the kernels widen bf16 copies as they read them, all four
  // as one element type, so a mix (a leaf, kept as it is, among results kept in bf16) is widened.
  std::vector<Tensor> backward(const Tensor& g) override {
    const bool kept_alike = same_kept_dtype({&saved_q, &saved_k, &saved_v, &saved_out});
    auto operand = [kept_alike](const SavedTensor& saved) { return kept_alike ? saved.stored() : saved.get(); };
    const Tensor q = operand(saved_q), k = operand(saved_k), v = operand(saved_v);
    Tensor dq = Tensor::empty_like(g), dk = Tensor::empty(k.shape(), g.dtype(), g.device());
    Tensor dv = Tensor::empty_like(dk);
    kernels::attention_backward(q, k, v, operand(saved_out), lse, g, scale, dq, dk, dv, doc_start);
    return {dq, dk, dv};
  }
};

// The same attention fed straight from the fused QKV projection: the kernels split it and turn q and k
// by RoPE as they read their blocks, so no rotated copy of q or k exists, and the node keeps the
// projection itself (as large as q, k and v together).
struct QkvAttentionNode : Node {
  SavedTensor saved_qkv, saved_out;
  Tensor lse, doc_start;
  double scale = 0, theta = 0;
  int64_t heads = 0, kv_heads = 0, pos_offset = 0;
  const char* name() const override { return "qkv_attention"; }
  // qkv and out as kept: the kernels widen bf16 copies as they read them, both as one element type (a leaf
  // qkv, kept as it is, beside out kept in bf16: both widened). dqkv, which goes to the QKV projection's
  // GEMMs only, in bf16 under mixed precision on a GPU (input_gradient_dtype).
  std::vector<Tensor> backward(const Tensor& g) override {
    const bool kept_alike = same_kept_dtype({&saved_qkv, &saved_out});
    const Tensor qkv = kept_alike ? saved_qkv.stored() : saved_qkv.get();
    const Tensor out = kept_alike ? saved_out.stored() : saved_out.get();
    Tensor dqkv = Tensor::empty(qkv.shape(), input_gradient_dtype(*this, 0, g), g.device());
    kernels::qkv_attention_backward(qkv, heads, kv_heads, theta, pos_offset, out, lse, g, scale, dqkv, doc_start);
    return {dqkv};
  }
};

}  // namespace

Variable qkv_attention(const Variable& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset,
                       const Tensor& doc_start) {
  LT_PROFILE_SCOPE("qkv_attention");
  const Tensor& x = qkv.value();
  LT_CHECK(x.ndim() == 3 && heads > 0 && kv_heads > 0 && x.dim(2) % (heads + 2 * kv_heads) == 0,
           "qkv_attention: qkv ", x.str(), " is not [B, T, (", heads, " + 2 * ", kv_heads, ") * head_dim]");
  const int64_t B = x.dim(0), T = x.dim(1), D = x.dim(2) / (heads + 2 * kv_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Tensor out = Tensor::empty({B, T, heads, D}, x.dtype(), x.device());
  Tensor lse = Tensor::empty({B, heads, T}, x.dtype(), x.device());
  // Under mixed precision the kernels write the bf16 copies of qkv and out that the nodes keep (this one,
  // and the output projection that reads out).
  const Tensor out_kept = kept_copy_to_fill(out);
  kernels::qkv_attention(x, heads, kv_heads, theta, pos_offset, scale, out, lse, doc_start, kept_copy_to_fill(qkv),
                         out_kept);
  auto node = std::make_shared<QkvAttentionNode>();
  node->scale = scale;
  node->theta = theta;
  node->heads = heads;
  node->kv_heads = kv_heads;
  node->pos_offset = pos_offset;
  if (grad_enabled()) {
    node->saved_qkv = SavedTensor::input(qkv);
    node->lse = lse;
    node->doc_start = doc_start;
  }
  Variable result = make_result(out, node, {qkv});
  keep_copy(result, out_kept);
  // out through the result: the output projection keeps the same copy.
  if (grad_enabled()) node->saved_out = SavedTensor::input(result);
  return result;
}

Variable attention(const Variable& q, const Variable& k, const Variable& v, const Tensor& doc_start) {
  LT_PROFILE_SCOPE("attention");
  const Tensor& qv = q.value();
  LT_CHECK(qv.ndim() == 4, "attention: q must be [B, T, Hq, D], got ", qv.str());
  // The kernel checks the rest (k and v against q, Hq a multiple of Hkv) with the same op name.
  const int64_t B = qv.dim(0), T = qv.dim(1), Hq = qv.dim(2), D = qv.dim(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Tensor out = Tensor::empty_like(qv);
  Tensor lse = Tensor::empty({B, Hq, T}, qv.dtype(), qv.device());
  kernels::attention(qv, k.value(), v.value(), scale, out, lse, doc_start);
  auto node = std::make_shared<AttentionNode>();
  node->scale = scale;
  if (grad_enabled()) {
    node->saved_q = SavedTensor::input(q);
    node->saved_k = SavedTensor::input(k);
    node->saved_v = SavedTensor::input(v);
    node->lse = lse;
    node->doc_start = doc_start;
  }
  Variable result = make_result(out, node, {q, k, v});
  if (grad_enabled()) node->saved_out = SavedTensor::input(result);
  return result;
}

}  // namespace lt
