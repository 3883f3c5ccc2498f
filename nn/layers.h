// The building blocks of a decoder: Linear, Embedding, RMSNorm, the SwiGLU MLP, grouped-query
// attention with fused QKV and RoPE; NormHead and the fused head + losses are in nn/normhead.h.
// Attribute names are the Hugging Face ones.
#pragma once
#include <vector>

#include "autograd/ops.h"
#include "nn/module.h"
#include "nn/normhead.h"  // so that callers of the layers keep seeing NormHead

namespace lt {

// y = x W^T, W [out, in], no bias (every released Ling config sets use_bias false).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, double init_std, Rng& rng);
  explicit Linear(Tensor weight);  // weight [out, in], as drawn by the caller
  // x [..., in] -> [..., out]. With an addend of the output's shape, addend + x W^T, the sum taken as the
  // GEMM writes its result (matmul_add): a residual connection without a pass of its own.
  Variable forward(const Variable& x, const Variable& addend = Variable()) const;
  Variable& weight() { return weight_; }

 private:
  Variable& weight_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, double init_std, Rng& rng);
  Variable forward(const Tensor& ids) const;  // ids [...] -> [..., dim]
  Variable& weight() { return weight_; }

 private:
  Variable& weight_;
};

class RMSNorm : public Module {
 public:
  RMSNorm(int64_t dim, double eps);
  Variable forward(const Variable& x) const;
  // The residual stream x + addend and its norm, the sum taken in the norm's pass (add_rmsnorm); without an
  // addend, x itself and its norm.
  AddRmsNorm forward(const Variable& x, const Variable& addend) const;

 private:
  Variable& weight_;
  double eps_;
};

// The weight of a fused gate and up projection, [..., 2I, H]: each matrix's first I rows the gate's, its
// last I the up projection's, so that one GEMM yields both ([..., 2I] outputs, as swiglu takes them). Drawn
// as two separate projections of `shape_IH` ([..., I, H]) would be, gate first: the same values, whichever
// layout holds them. model/hf_names.cpp splits it into the Hugging Face gate_proj and up_proj.
Tensor init_gate_up(const Shape& shape_IH, double init_std, Rng& rng);

// down(silu(gate(x)) * up(x)), gate and up one projection `gate_up_proj` [2I, H]: dense layers, the shared
// expert. With an addend (x's shape), that plus the MLP's output, summed by the down projection
// (Linear::forward).
class SwiGLUMLP : public Module {
 public:
  SwiGLUMLP(int64_t hidden, int64_t intermediate, double init_std, Rng& rng);
  Variable forward(const Variable& x, const Variable& addend = Variable()) const;

 private:
  Linear& gate_up_proj_;
  Linear& down_proj_;
};

struct AttentionShape {
  int64_t hidden, heads, kv_heads, head_dim;
  double rope_theta;
};

// Keys and values of earlier positions, for generation one token at a time. Each row holds its own
// sequence, so rows decoded together may have different lengths (ragged prompts).
struct KVCache {
  Tensor k_BTHD, v_BTHD;        // [B, capacity, Hkv, D]
  std::vector<int64_t> length_B;  // the positions each row holds
};

// Grouped-query attention: fused query_key_value projection whose output rows are [all Q heads |
// all K heads | all V heads], RoPE on Q and K, causal softmax attention, output projection `dense`.
class Attention : public Module {
 public:
  Attention(const AttentionShape& shape, double init_std, Rng& rng);
  // x [B, T, hidden]; positions start at pos_offset. With a cache, each row's positions continue from its
  // cached length instead (pos_offset must be 0), its new keys and values are appended and attention covers
  // its cached prefix (inference only). doc_start (i32 [B, T]): packed
  // documents, each token attending within its own (kernels::attention); not with a cache. With a
  // residual (x's shape), residual + the attention's output, summed by the output projection.
  Variable forward(const Variable& x, int64_t pos_offset = 0, KVCache* cache = nullptr,
                   const Tensor& doc_start = Tensor(), const Variable& residual = Variable()) const;
  // A recipe stage may change RoPE's base (Ling extends the context with theta 10K -> 600K).
  void set_rope_theta(double theta) { shape_.rope_theta = theta; }

 private:
  AttentionShape shape_;
  Linear& query_key_value_;
  Linear& dense_;
};

}  // namespace lt
