// The Ling decoder (BailingMoeForCausalLM), built from a LingConfig. Module attribute names follow
// the Hugging Face code, so parameter names are the checkpoint names (docs/architecture.md §6.1),
// except that routed experts are stored stacked per projection (§6.2, model/hf_names.h).
#pragma once
#include <memory>
#include <vector>

#include "model/config.h"
#include "moe/moe_layer.h"
#include "nn/layers.h"

namespace lt {

class DecoderLayer : public Module {
 public:
  DecoderLayer(const LingConfig& config, int64_t index, Rng& rng);
  // x1 = x + attention(norm(x)); x2 = x1 + mlp(norm(x1)).
  Variable forward(const Variable& x_BTH, MoEContext& context, int64_t pos_offset, KVCache* cache,
                   const Tensor& doc_start_BT = Tensor());
  MoEBlock* moe() { return moe_; }
  Attention& attention() { return attention_; }

 private:
  RMSNorm& input_layernorm_;
  Attention& attention_;
  RMSNorm& post_attention_layernorm_;
  SwiGLUMLP* dense_mlp_ = nullptr;
  MoEBlock* moe_ = nullptr;
};

class LingBackbone : public Module {
 public:
  LingBackbone(const LingConfig& config, Rng& rng);
  Variable forward(const Tensor& ids_BT, MoEContext& context, int64_t pos_offset, std::vector<KVCache>* caches,
                   const Tensor& doc_start_BT = Tensor());
  std::vector<DecoderLayer*>& layers() { return layers_; }

 private:
  Embedding& word_embeddings_;
  std::vector<DecoderLayer*> layers_;
  RMSNorm* norm_ = nullptr;
};

// The losses stay on the model's device; callers read them with .item() when they log.
struct LossBreakdown {
  // total = lm + aux, what backward runs on; lm the mean next-token cross-entropy over the non-ignored targets.
  Variable total, lm;
  // f64 [1] sums over the MoE layers, in layer order (zero for a dense model): aux of each layer's
  // aux_coef * balance + z_coef * z, and the unscaled balance and z losses.
  Tensor aux, balance, z;
};

class LingForCausalLM : public Module {
 public:
  LingForCausalLM(const LingConfig& config, uint64_t seed);
  const LingConfig& config() const { return config_; }

  // Logits [B, T, V] of ids [B, T], for evaluation and sampling (loss() never forms them). With caches
  // (one per layer), positions continue from pos_offset.
  Variable logits(const Tensor& ids_BT, MoEContext& context, int64_t pos_offset = 0,
                  std::vector<KVCache>* caches = nullptr);
  // Loss of ids [B, T] against targets [B, T] (ignore_index -100): cross-entropy (through the fused
  // NormHead, normhead_cross_entropy) plus the MoE auxiliary losses collected in `context`. With
  // doc_start_BT (i32 [B, T]) each row holds packed documents that attend only within themselves
  // (kernels::attention). Positions are not restarted per document: RoPE makes the scores depend on
  // the distance between positions only, so a packed document sees what it would see alone.
  LossBreakdown loss(const Tensor& ids_BT, const Tensor& targets_BT, MoEContext& context,
                     const Tensor& doc_start_BT = Tensor());

  std::vector<KVCache> make_kv_caches(int64_t batch, int64_t capacity) const;
  // Every layer's RoPE base and the config's rope_theta (what a saved config.json then says).
  void set_rope_theta(double theta);
  std::vector<MoEBlock*> moe_blocks();

 private:
  LingConfig config_;
  LingBackbone* model_;
  Variable* lm_head_VH_;
};

}  // namespace lt
