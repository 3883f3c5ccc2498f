// The Ling model configuration: the keys of a Hugging Face `config.json` for `bailing_moe`
// (docs/architecture.md §2), plus a few lingtrain training keys that the Hugging Face code ignores.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lt {

enum class NormHeadGrad {
  Detached,  // the Hugging Face training path: the column-norm denominator is detached (default)
  Full,      // the full Jacobian of the column normalisation (docs/architecture.md §4.2; UNVERIFIED which
             // Ling used)
};

struct LingConfig {
  std::string name = "custom";  // preset name, or "custom" for a file
  // Architecture (Hugging Face keys).
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;                 // 0 in the file means hidden_size / num_attention_heads
  int64_t intermediate_size = 0;        // dense SwiGLU layers (the first first_k_dense_replace)
  int64_t moe_intermediate_size = 0;    // one routed expert
  int64_t num_experts = 0;              // 0 means a dense model
  int64_t num_shared_experts = 0;       // the shared expert's width is moe_intermediate_size * this
  int64_t num_experts_per_tok = 1;
  bool norm_topk_prob = true;
  int64_t first_k_dense_replace = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 4096;
  bool norm_head = true;
  bool tie_word_embeddings = false;
  bool use_bias = false;
  bool use_qkv_bias = false;
  double initializer_range = 0.006;
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 0;
  // Training knobs stored alongside (ignored by the Hugging Face code).
  double aux_loss_coef = 0.015;  // load-balance loss, Ling-Plus pretraining value
  double z_loss_coef = 1e-4;     // router z-loss
  NormHeadGrad norm_head_grad = NormHeadGrad::Detached;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  bool is_moe_layer(int64_t layer) const { return num_experts > 0 && layer >= first_k_dense_replace; }
  // The decoder-layer indices of the MoE layers, in order: how metrics and inspection name a MoE layer
  // (model.layers.<index>.mlp).
  std::vector<int64_t> moe_layer_indices() const {
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < num_hidden_layers; ++i)
      if (is_moe_layer(i)) indices.push_back(i);
    return indices;
  }

  // Throws lt::Error naming `origin` (a file name or preset) on an inconsistent configuration.
  void validate(const std::string& origin) const;
};

// Presets are the config.json files model/presets/<name>.json, embedded in the binary at build time:
// "tiny" (the default: trains on a 2-core CPU in minutes), "small" (a larger CPU model), the bench
// shapes "moe-s", "moe-m", "dense-124m", the released "ling-lite" and "ling-plus" shapes, and
// "ling-lite-4l" (Ling-Lite's first four layers, the GPU bench shape that fits one 80 GB GPU).
// An unknown name fails listing the presets.
LingConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();  // sorted

struct ParameterCount {
  int64_t total = 0;
  int64_t active = 0;  // per token: k routed experts, not all E (embedding and head counted)
};
// Counted from the shapes alone: nothing is allocated, so Ling-Plus can be counted on a laptop.
ParameterCount count_parameters(const LingConfig& config);

}  // namespace lt

#include "io/json.h"

namespace lt {
// config.json <-> LingConfig. Absent keys take the Hugging Face class defaults, except where
// docs/architecture.md §2.3 lists a departure; keys without a usable default (sizes) are required.
LingConfig config_from_json(const Json& json, const std::string& source);
LingConfig load_config(const std::string& path);
Json config_to_json(const LingConfig& config);
// A preset name or a path to a config.json.
LingConfig resolve_config(const std::string& preset_or_path);
}  // namespace lt
