// The Ling decoder (BailingMoeForCausalLM), built from a LingConfig. Module attribute names follow
// the Hugging Face code, so parameter names are the checkpoint names (docs/architecture.md §6.1),
// except that routed experts are stored stacked per projection (§6.2, model/hf_names.h).
#pragma once
#include <memory>
#include <vector>

#include "model/config.h"
#include "moe/moe_layer.h"
#include "nn/layers.h"
#include "nn/normhead.h"

namespace lt {

// The residual stream [B, T, H] between layers, stream + pending: a layer's last addend (an MoE block's
// output) is added by the next norm in its own pass (RMSNorm::forward with an addend), not by a pass of its
// own. pending is undefined where nothing waits (the embeddings; a dense layer's output, which its down
// projection adds as it writes it).
struct ResidualStream {
  Variable stream, pending;
};

class DecoderLayer : public Module {
 public:
  DecoderLayer(const LingConfig& config, int64_t index, const ExpertSlice& experts, Rng& rng);
  // x1 = x + attention(norm(x)); x2 = x1 + mlp(norm(x1)), x2 returned with mlp(norm(x1)) pending where the
  // mlp is an MoE block.
  ResidualStream forward(const ResidualStream& x, MoEContext& context, int64_t pos_offset, KVCache* cache,
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
  LingBackbone(const LingConfig& config, const ExpertSlice& experts, Rng& rng);
  Variable forward(const Tensor& ids_BT, MoEContext& context, int64_t pos_offset, std::vector<KVCache>* caches,
                   const Tensor& doc_start_BT = Tensor());
  std::vector<DecoderLayer*>& layers() { return layers_; }
  // Under parameter sharding: the embeddings, each layer and the final norm are gathered around their uses.
  void set_parameter_gathering(ParameterGathering* gathering) { gathering_ = gathering; }

 private:
  ParameterGathering* gathering_ = nullptr;
  Embedding& word_embeddings_;
  std::vector<DecoderLayer*> layers_;
  RMSNorm* norm_ = nullptr;
};

// The losses stay on the model's device; callers read them with .item() when they log.
struct LossBreakdown {
  // total = lm + aux, what backward runs on; lm the objective: the mean next-token cross-entropy over the
  // non-ignored targets (pre-training, SFT), or another one (DPO's loss) through add_auxiliary_losses.
  Variable total, lm;
  // f64 [1] sums over the MoE layers, in layer order (zero for a dense model): aux of each layer's
  // aux_coef * balance + z_coef * z, and the unscaled balance and z losses.
  Tensor aux, balance, z;
  // An objective's own f64 sums (DPO's, kernels::DpoStat), added up over a step's micro-batches;
  // undefined for the language-model loss.
  Tensor stats = Tensor();
};

class LingForCausalLM : public Module {
 public:
  // experts: the routed experts this process holds (all of them unless expert parallel); the initial
  // values are the ones the whole model draws from `seed`, whatever the slice.
  LingForCausalLM(const LingConfig& config, uint64_t seed, const ExpertSlice& experts = {});
  const LingConfig& config() const { return config_; }
  const ExpertSlice& expert_slice() const { return experts_; }
  // Under expert parallelism: the group every MoE layer's forward exchanges its rows through.
  void set_expert_group(ExpertGroup* group);
  // Under parameter sharding (--shard-params): told when each part of the model (the embeddings, each decoder
  // layer, the final norm, the head) begins and ends its forward and begins its backward; null: every
  // parameter is always whole.
  void set_parameter_gathering(ParameterGathering* gathering);
  // Where the weights live (Module::to moves them). Token ids, targets and document starts given on
  // another device (the host, where batches are made) are copied here as each call begins.
  Device device() const { return lm_head_VH_->value().device(); }

  // Logits [B, T, V] of ids [B, T], for evaluation and sampling (loss() never forms them). With caches
  // (one per layer), each row's positions continue from its cached length (pos_offset 0). With head_VH
  // (decoding_head()), the head is that table instead of being made from the weights at this call.
  Variable logits(const Tensor& ids_BT, MoEContext& context, int64_t pos_offset = 0,
                  std::vector<KVCache>* caches = nullptr, const Tensor& head_VH = Tensor());
  // The logits [B, V] of the token after each row's first lengths_B[b] ids (1 <= lengths_B[b] <= T) of ids
  // [B, T] (a shorter row padded after its ids with any valid ids), through the caches (one per layer,
  // each row's positions continuing from its cached length), with head_VH as logits() takes it: the
  // prefill of ragged prompts together, and the steps of decoding. The head multiplies those B rows only.
  // The caches' lengths then count all T positions of every row: the caller sets them to its own.
  Variable next_token_logits(const Tensor& ids_BT, const std::vector<int64_t>& lengths_B, MoEContext& context,
                             std::vector<KVCache>& caches, const Tensor& head_VH = Tensor());
  // The head [V, H] as logits() applies it (NormHead's column-normalised table, or the weights), made
  // once for the many forwards of a generation while the weights stay as they are; its own copy under
  // parameter sharding, where the whole head exists only around its uses.
  Tensor decoding_head();
  // The final hidden states [B, T, H] of ids [B, T], before the head: what inspection runs to see the
  // routing (the logits of a large vocabulary would cost far more than the layers).
  Variable final_hidden_states(const Tensor& ids_BT, MoEContext& context);
  // Loss of ids [B, T] against targets [B, T] (ignore_index -100): cross-entropy (through the fused
  // NormHead, normhead_cross_entropy) plus the MoE auxiliary losses collected in `context`. With
  // doc_start_BT (i32 [B, T]) each row holds packed documents that attend only within themselves
  // (kernels::attention). Positions are not restarted per document: RoPE makes the scores depend on
  // the distance between positions only, so a packed document sees what it would see alone.
  LossBreakdown loss(const Tensor& ids_BT, const Tensor& targets_BT, MoEContext& context,
                     const Tensor& doc_start_BT = Tensor());
  // log p(target) of every position, [B T] (0 where the target is -100), through the fused NormHead
  // (normhead_token_logprobs), with the MoE auxiliary losses collected in `context` as loss() does: the
  // log-probabilities DPO sums per response.
  Variable target_logprobs(const Tensor& ids_BT, const Tensor& targets_BT, MoEContext& context,
                           const Tensor& doc_start_BT = Tensor());
  // A loss built on the model's output plus the auxiliary losses in `context`: total = objective + aux.
  LossBreakdown add_auxiliary_losses(const Variable& objective, const MoEContext& context) const;

  std::vector<KVCache> make_kv_caches(int64_t batch, int64_t capacity) const;
  // Every layer's RoPE base and the config's rope_theta (what a saved config.json then says).
  void set_rope_theta(double theta);
  // The weights of every MoE layer's load-balance and z losses, and the config's (what a saved config.json says).
  // Every MoE layer folds its step's routing-warmup observations into its statistics (MoEBlock).
  void fold_routing_warmup();
  void set_aux_loss_coefficients(double aux_loss_coef, double z_loss_coef);
  // Raises max_position_embeddings (RoPE has no position table, so no parameter changes): a stage that
  // trains on longer sequences extends the context, as Ling's long-context stages do.
  void extend_context(int64_t positions);
  std::vector<MoEBlock*> moe_blocks();

 private:
  // The final hidden states [B T, H] of ids [B, T], and how the head enters the fused losses.
  Variable hidden_states(const Tensor& ids_BT, const Tensor& targets_BT, MoEContext& context,
                         const Tensor& doc_start_BT);
  HeadNorm head_norm() const;
  // h [N, H] times the head: head_VH where given (decoding_head()), else the head made from the weights.
  Variable apply_head(const Variable& h_NH, const Tensor& head_VH);
  Tensor here(const Tensor& t) const { return t.defined() ? t.to(device()) : t; }

  LingConfig config_;
  ExpertSlice experts_;
  ParameterGathering* gathering_ = nullptr;
  LingBackbone* model_;
  Variable* lm_head_VH_;
};

}  // namespace lt
