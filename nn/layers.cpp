#include "nn/layers.h"

#include <algorithm>
#include <cmath>

#include "tensor/kernels.h"

namespace lt {

// ---- Linear -----------------------------------------------------------------------------------
Linear::Linear(int64_t in_features, int64_t out_features, double init_std, Rng& rng)
    : Linear(init_normal({out_features, in_features}, init_std, rng)) {}

Linear::Linear(Tensor weight) : weight_(add_parameter("weight", std::move(weight), true)) {
  LT_CHECK(weight_.value().ndim() == 2, "Linear: weight must be [out, in], got ", weight_.value().str());
}

Variable Linear::forward(const Variable& x, const Variable& addend) const {
  const int64_t in = weight_.dim(1), out = weight_.dim(0);
  LT_CHECK(x.dim(-1) == in, "Linear: input ", x.value().str(), " does not end in ", in);
  Shape out_shape = x.shape();
  out_shape.back() = out;
  const Variable x2 = reshape(x, {-1, in});
  if (!addend.defined()) return reshape(matmul(x2, weight_, false, true), out_shape);
  LT_CHECK(addend.shape() == out_shape, "Linear: addend ", addend.value().str(), " is not the output's shape ",
           shape_str(out_shape));
  return reshape(matmul_add(x2, weight_, reshape(addend, {-1, out}), false, true), out_shape);
}

// ---- Embedding --------------------------------------------------------------------------------
Embedding::Embedding(int64_t vocab, int64_t dim, double init_std, Rng& rng)
    : weight_(add_parameter("weight", init_normal({vocab, dim}, init_std, rng), true)) {}

Variable Embedding::forward(const Tensor& ids) const { return embedding(weight_, ids); }

// ---- RMSNorm ----------------------------------------------------------------------------------
RMSNorm::RMSNorm(int64_t dim, double eps)
    : weight_(add_parameter("weight", Tensor::full({dim}, 1.0), false)), eps_(eps) {}

Variable RMSNorm::forward(const Variable& x) const { return rmsnorm(x, weight_, eps_); }

AddRmsNorm RMSNorm::forward(const Variable& x, const Variable& addend) const {
  if (!addend.defined()) return {x, forward(x)};
  return add_rmsnorm(x, addend, weight_, eps_);
}

// ---- SwiGLU MLP -------------------------------------------------------------------------------
Tensor init_gate_up(const Shape& shape_IH, double init_std, Rng& rng) {
  LT_CHECK(shape_IH.size() >= 2, "init_gate_up: expected [..., I, H], got ", shape_str(shape_IH));
  const Tensor gate = init_normal(shape_IH, init_std, rng), up = init_normal(shape_IH, init_std, rng);
  Shape fused_shape = shape_IH;
  fused_shape[fused_shape.size() - 2] *= 2;
  Tensor fused = Tensor::empty(fused_shape);
  const int64_t matrix = shape_IH[shape_IH.size() - 2] * shape_IH.back();
  const Tensor gate_rows = gate.reshape({-1, matrix}), up_rows = up.reshape({-1, matrix});
  const Tensor fused_rows = fused.reshape({-1, 2, matrix});
  for (int64_t m = 0; m < gate_rows.dim(0); ++m) {
    Tensor halves = fused_rows.narrow(m, 1).reshape({2, matrix});
    halves.narrow(0, 1).copy_from(gate_rows.narrow(m, 1));
    halves.narrow(1, 1).copy_from(up_rows.narrow(m, 1));
  }
  return fused;
}

SwiGLUMLP::SwiGLUMLP(int64_t hidden, int64_t intermediate, double init_std, Rng& rng)
    : gate_up_proj_(add_module("gate_up_proj",
                               std::make_unique<Linear>(init_gate_up({intermediate, hidden}, init_std, rng)))),
      down_proj_(add_module("down_proj", std::make_unique<Linear>(intermediate, hidden, init_std, rng))) {}

Variable SwiGLUMLP::forward(const Variable& x, const Variable& addend) const {
  return down_proj_.forward(swiglu(gate_up_proj_.forward(x)), addend);
}

// ---- Attention --------------------------------------------------------------------------------
Attention::Attention(const AttentionShape& shape, double init_std, Rng& rng)
    : shape_(shape),
      query_key_value_(add_module(
          "query_key_value",
          std::make_unique<Linear>(shape.hidden, (shape.heads + 2 * shape.kv_heads) * shape.head_dim, init_std, rng))),
      dense_(add_module("dense", std::make_unique<Linear>(shape.heads * shape.head_dim, shape.hidden, init_std, rng))) {}

Variable Attention::forward(const Variable& x, int64_t pos_offset, KVCache* cache, const Tensor& doc_start,
                            const Variable& residual) const {
  const int64_t B = x.dim(0), T = x.dim(1), D = shape_.head_dim;
  const int64_t Hq = shape_.heads, Hkv = shape_.kv_heads;
  const Variable qkv = query_key_value_.forward(x);  // [B, T, (Hq + 2 Hkv) D]
  Variable context;
  if (cache == nullptr) {
    context = qkv_attention(qkv, Hq, Hkv, shape_.rope_theta, pos_offset, doc_start);
  } else {
    LT_CHECK(!doc_start.defined(), "Attention: packed documents (doc_start) with a KV cache are not supported");
    LT_CHECK(!grad_enabled() || !x.requires_grad(), "Attention: the KV cache is for inference only");
    LT_CHECK(pos_offset == 0, "Attention: with a KV cache positions continue from the cache, got pos_offset ",
             pos_offset);
    const int64_t capacity = cache->k_BTHD.dim(1);
    LT_CHECK(cache->k_BTHD.dim(0) == B && static_cast<int64_t>(cache->length_B.size()) == B, "Attention: KV cache ",
             cache->k_BTHD.str(), " with ", cache->length_B.size(), " lengths for ", B, " rows");
    const Tensor& projection = qkv.value();
    Tensor q = Tensor::empty({B, T, Hq, D}, projection.dtype(), projection.device());
    for (const int64_t length : cache->length_B)
      LT_CHECK(length + T <= capacity, "Attention: KV cache full (capacity ", capacity, ")");
    const bool prefill = std::all_of(cache->length_B.begin(), cache->length_B.end(), [](int64_t n) { return n == 0; });
    // Each row at its own positions: its new keys and values go after its cached ones.
    kernels::split_qkv_rope_to_cache(projection, shape_.rope_theta, cache->length_B, q, cache->k_BTHD, cache->v_BTHD);
    for (int64_t& length : cache->length_B) length += T;
    if (prefill) {
      // Nothing cached before: the new positions attend only each other, as without a cache, and the
      // blocked kernel does that in a fraction of the decoding kernel's time (one query row at a time).
      context = qkv_attention(qkv, Hq, Hkv, shape_.rope_theta, 0);
    } else {
      Tensor out = Tensor::empty_like(q);
      kernels::attention_decode(q, cache->k_BTHD, cache->v_BTHD, cache->length_B, 1.0 / std::sqrt(double(D)), out);
      context = Variable(out);
    }
  }
  return dense_.forward(reshape(context, {B, T, Hq * D}), residual);
}

}  // namespace lt
