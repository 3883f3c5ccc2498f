#include "nn/layers.h"

#include <cmath>

#include "tensor/kernels.h"

namespace lt {

// ---- Linear -----------------------------------------------------------------------------------
Linear::Linear(int64_t in_features, int64_t out_features, double init_std, Rng& rng)
    : weight_(add_parameter("weight", init_normal({out_features, in_features}, init_std, rng), true)) {}

Variable Linear::forward(const Variable& x) const {
  const int64_t in = weight_.dim(1), out = weight_.dim(0);
  LT_CHECK(x.dim(-1) == in, "Linear: input ", x.value().str(), " does not end in ", in);
  Shape out_shape = x.shape();
  out_shape.back() = out;
  const Variable x2 = reshape(x, {-1, in});
  return reshape(matmul(x2, weight_, false, true), out_shape);
}

// ---- Embedding --------------------------------------------------------------------------------
Embedding::Embedding(int64_t vocab, int64_t dim, double init_std, Rng& rng)
    : weight_(add_parameter("weight", init_normal({vocab, dim}, init_std, rng), true)) {}

Variable Embedding::forward(const Tensor& ids) const { return embedding(weight_, ids); }

// ---- RMSNorm ----------------------------------------------------------------------------------
RMSNorm::RMSNorm(int64_t dim, double eps)
    : weight_(add_parameter("weight", Tensor::full({dim}, 1.0), false)), eps_(eps) {}

Variable RMSNorm::forward(const Variable& x) const { return rmsnorm(x, weight_, eps_); }

// ---- SwiGLU MLP -------------------------------------------------------------------------------
SwiGLUMLP::SwiGLUMLP(int64_t hidden, int64_t intermediate, double init_std, Rng& rng)
    : gate_proj_(add_module("gate_proj", std::make_unique<Linear>(hidden, intermediate, init_std, rng))),
      up_proj_(add_module("up_proj", std::make_unique<Linear>(hidden, intermediate, init_std, rng))),
      down_proj_(add_module("down_proj", std::make_unique<Linear>(intermediate, hidden, init_std, rng))) {}

Variable SwiGLUMLP::forward(const Variable& x) const {
  return down_proj_.forward(swiglu(gate_proj_.forward(x), up_proj_.forward(x)));
}

// ---- Attention --------------------------------------------------------------------------------
Attention::Attention(const AttentionShape& shape, double init_std, Rng& rng)
    : shape_(shape),
      query_key_value_(add_module(
          "query_key_value",
          std::make_unique<Linear>(shape.hidden, (shape.heads + 2 * shape.kv_heads) * shape.head_dim, init_std, rng))),
      dense_(add_module("dense", std::make_unique<Linear>(shape.heads * shape.head_dim, shape.hidden, init_std, rng))) {}

Variable Attention::forward(const Variable& x, int64_t pos_offset, KVCache* cache) const {
  const int64_t B = x.dim(0), T = x.dim(1), D = shape_.head_dim;
  const int64_t Hq = shape_.heads, Hkv = shape_.kv_heads;
  const Variable qkv = query_key_value_.forward(x);  // [B, T, (Hq + 2 Hkv) D]
  const Variable q = rope(reshape(slice_cols(qkv, 0, Hq * D), {B, T, Hq, D}), shape_.rope_theta, pos_offset);
  const Variable k = rope(reshape(slice_cols(qkv, Hq * D, Hkv * D), {B, T, Hkv, D}), shape_.rope_theta, pos_offset);
  const Variable v = reshape(slice_cols(qkv, (Hq + Hkv) * D, Hkv * D), {B, T, Hkv, D});
  Variable context;
  if (cache == nullptr) {
    context = attention(q, k, v);
  } else {
    LT_CHECK(!grad_enabled() || !x.requires_grad(), "Attention: the KV cache is for inference only");
    LT_CHECK(cache->length == pos_offset, "Attention: cache holds ", cache->length, " positions, asked to start at ",
             pos_offset);
    LT_CHECK(cache->length + T <= cache->k_BTHD.dim(1), "Attention: KV cache full (capacity ", cache->k_BTHD.dim(1),
             ")");
    // Append the new positions: copy each batch row's [T, Hkv, D] block into the cache.
    for (int64_t b = 0; b < B; ++b) {
      const int64_t capacity = cache->k_BTHD.dim(1);
      Tensor k_dst = cache->k_BTHD.reshape({B * capacity, Hkv, D}).narrow(b * capacity + cache->length, T);
      Tensor v_dst = cache->v_BTHD.reshape({B * capacity, Hkv, D}).narrow(b * capacity + cache->length, T);
      k_dst.copy_from(k.value().narrow(b, 1).reshape({T, Hkv, D}));
      v_dst.copy_from(v.value().narrow(b, 1).reshape({T, Hkv, D}));
    }
    cache->length += T;
    Tensor out = Tensor::empty(q.shape(), q.value().dtype(), q.value().device());
    kernels::attention_decode(q.value(), cache->k_BTHD, cache->v_BTHD, cache->length, 1.0 / std::sqrt(double(D)), out);
    context = Variable(out);
  }
  return dense_.forward(reshape(context, {B, T, Hq * D}));
}

// ---- NormHead column normalisation ------------------------------------------------------------
namespace {

constexpr double kNormHeadEps = 1e-7;  // added to the norm, as the Hugging Face code does

struct ColumnNormalizeNode : Node {
  Tensor normalized_VH;  // W / n, saved for the full Jacobian
  Tensor inv_norm_H;     // 1 / (||W[:, j]|| + eps)
  bool detached;
  const char* name() const override { return detached ? "column_normalize(detached)" : "column_normalize(full)"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    // detached: dW = g / n.  full: dW = (g - Wn * sum_v(g * Wn)) / n, the Jacobian of W / ||W||
    // (the eps in the denominator makes this exact only up to eps / n, far below f32 resolution).
    Tensor dw = Tensor::empty_like(g);
    if (detached) {
      kernels::mul(g, inv_norm_H, dw);
      return {dw};
    }
    Tensor g_wn = Tensor::empty_like(g);
    kernels::mul(g, normalized_VH, g_wn);
    Tensor proj_H = Tensor::empty_like(inv_norm_H);
    kernels::sum_to(g_wn, proj_H);
    kernels::mul(normalized_VH, proj_H, g_wn);   // Wn * sum_v(g Wn)
    kernels::sub(g, g_wn, dw);
    kernels::mul(dw, inv_norm_H, dw);
    return {dw};
  }
};

}  // namespace

Variable column_normalize(const Variable& w_VH, bool detached) {
  const Tensor& w = w_VH.value();
  LT_CHECK(w.ndim() == 2, "column_normalize: weight must be [V, H], got ", w.str());
  Tensor squares = Tensor::empty_like(w);
  kernels::mul(w, w, squares);
  Tensor inv_norm_H = Tensor::empty({w.dim(1)}, w.dtype(), w.device());
  kernels::sum_to(squares, inv_norm_H);
  {
    // 1 / (sqrt(sum of squares) + eps) on the host: H values, once per step.
    Tensor host = inv_norm_H.to(Device::cpu()).to(DType::F64);
    double* v = host.data<double>();
    for (int64_t j = 0; j < host.numel(); ++j) v[j] = 1.0 / (std::sqrt(v[j]) + kNormHeadEps);
    inv_norm_H.copy_from(host.to(w.dtype()).to(w.device()));
  }
  Tensor normalized = Tensor::empty_like(w);
  kernels::mul(w, inv_norm_H, normalized);
  auto node = std::make_shared<ColumnNormalizeNode>();
  node->detached = detached;
  node->inv_norm_H = inv_norm_H;
  if (!detached && grad_enabled()) node->normalized_VH = normalized;
  return make_result(normalized, node, {w_VH});
}

}  // namespace lt
