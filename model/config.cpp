#include "model/config.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include "model/preset_texts.h"
#include "tensor/error.h"

namespace lt {

namespace {

// int64 arithmetic that remembers an overflow instead of wrapping: the sizes come from config.json, and
// absurd ones must be an error, not signed overflow (undefined behaviour; caught by UBSan under tests/fuzz/fuzz_config).
class CheckedInt {
 public:
  CheckedInt(int64_t value) : value_(value) {}  // implicit, so formulas read as plain arithmetic
  friend CheckedInt operator+(CheckedInt a, CheckedInt b) {
    CheckedInt sum(0);
    sum.overflow_ = a.overflow_ || b.overflow_ || __builtin_add_overflow(a.value_, b.value_, &sum.value_);
    return sum;
  }
  friend CheckedInt operator*(CheckedInt a, CheckedInt b) {
    CheckedInt product(0);
    product.overflow_ = a.overflow_ || b.overflow_ || __builtin_mul_overflow(a.value_, b.value_, &product.value_);
    return product;
  }
  std::optional<int64_t> value() const { return overflow_ ? std::nullopt : std::optional<int64_t>(value_); }

 private:
  int64_t value_;
  bool overflow_ = false;
};

// The parameter count, or nothing when it overflows int64. Layers come in two kinds (dense, MoE), so
// they are counted per kind rather than one by one: num_hidden_layers may be anything a file says.
std::optional<ParameterCount> checked_parameter_count(const LingConfig& c) {
  const CheckedInt H = c.hidden_size, hd = c.resolved_head_dim();
  const CheckedInt attention = (CheckedInt(c.num_attention_heads) + 2 * CheckedInt(c.num_key_value_heads)) * hd * H +
                               H * c.num_attention_heads * hd;
  const CheckedInt per_layer = attention + 2 * H;  // and the two norms
  const int64_t moe_layers =
      c.num_experts > 0 ? std::max<int64_t>(0, c.num_hidden_layers - c.first_k_dense_replace) : 0;
  const int64_t dense_layers = c.num_hidden_layers - moe_layers;

  // The embedding, the lm_head, the final norm, and each layer's attention and norms.
  CheckedInt total = 2 * CheckedInt(c.vocab_size) * H + H + CheckedInt(c.num_hidden_layers) * per_layer;
  CheckedInt active = total;
  if (dense_layers > 0) {  // unused sizes of an all-MoE model must not overflow the count
    const CheckedInt dense_mlp = 3 * H * c.intermediate_size;
    total = total + dense_layers * dense_mlp;
    active = active + dense_layers * dense_mlp;
  }
  if (moe_layers > 0) {  // per token, k routed experts are active, not all E
    const CheckedInt expert = 3 * H * c.moe_intermediate_size;
    const CheckedInt router_and_shared = CheckedInt(c.num_experts) * H + expert * c.num_shared_experts;
    total = total + moe_layers * (router_and_shared + CheckedInt(c.num_experts) * expert);
    active = active + moe_layers * (router_and_shared + CheckedInt(c.num_experts_per_tok) * expert);
  }
  if (!total.value() || !active.value()) return std::nullopt;
  return ParameterCount{*total.value(), *active.value()};
}

}  // namespace

void LingConfig::validate(const std::string& origin) const {
  auto positive = [&](int64_t v, const char* key) {
    LT_CHECK(v > 0, origin, ": ", key, " must be > 0, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(max_position_embeddings, "max_position_embeddings");
  LT_CHECK(num_attention_heads % num_key_value_heads == 0, origin, ": num_attention_heads (", num_attention_heads,
           ") must be a multiple of num_key_value_heads (", num_key_value_heads, ")");
  LT_CHECK(head_dim > 0 || hidden_size % num_attention_heads == 0, origin, ": hidden_size (", hidden_size,
           ") is not a multiple of num_attention_heads (", num_attention_heads, ") and head_dim is not set");
  LT_CHECK(resolved_head_dim() % 2 == 0, origin, ": head_dim must be even for RoPE, got ", resolved_head_dim());
  LT_CHECK(num_experts >= 0 && num_shared_experts >= 0, origin, ": expert counts must be >= 0");
  LT_CHECK(first_k_dense_replace >= 0, origin, ": first_k_dense_replace must be >= 0");
  if (num_experts > 0) {
    positive(moe_intermediate_size, "moe_intermediate_size");
    LT_CHECK(num_experts_per_tok >= 1 && num_experts_per_tok <= num_experts, origin,
             ": num_experts_per_tok must be in [1, num_experts], got ", num_experts_per_tok);
  }
  const bool has_dense = num_experts == 0 || first_k_dense_replace > 0;
  if (has_dense) positive(intermediate_size, "intermediate_size");
  LT_CHECK(rms_norm_eps > 0, origin, ": rms_norm_eps must be > 0");
  LT_CHECK(rope_theta > 0, origin, ": rope_theta must be > 0");
  LT_CHECK(pad_token_id >= 0 && pad_token_id < vocab_size, origin, ": pad_token_id ", pad_token_id,
           " is outside the vocabulary of ", vocab_size);
  LT_CHECK(eos_token_id >= 0 && eos_token_id < vocab_size, origin, ": eos_token_id ", eos_token_id,
           " is outside the vocabulary of ", vocab_size);
  LT_CHECK(!use_bias && !use_qkv_bias, origin, ": use_bias / use_qkv_bias are not supported (every released Ling "
           "config sets them false)");
  LT_CHECK(!tie_word_embeddings, origin, ": tie_word_embeddings is not supported (Ling unties the head)");
  LT_CHECK(checked_parameter_count(*this), origin, ": the sizes give more parameters than a 64-bit count holds");
}

LingConfig preset_config(const std::string& name) {
  for (const PresetText& preset : preset_texts()) {
    if (preset.name != name) continue;
    const std::string source = "preset '" + name + "' (model/presets/" + name + ".json)";
    return config_from_json(parse_json(preset.json, source), source);
  }
  std::string known;
  for (const std::string& preset : preset_names()) known += (known.empty() ? "" : ", ") + preset;
  fail("unknown model preset '", name, "' (presets: ", known, ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const PresetText& preset : preset_texts()) names.emplace_back(preset.name);
  return names;
}

ParameterCount count_parameters(const LingConfig& c) {
  const std::optional<ParameterCount> count = checked_parameter_count(c);
  LT_CHECK(count, "count_parameters: the sizes give more parameters than a 64-bit count holds");
  return *count;
}

}  // namespace lt

namespace lt {

LingConfig config_from_json(const Json& json, const std::string& source) {
  const JsonObject o(json, source);
  if (o.has("model_type")) {
    const std::string type = o.get<std::string>("model_type");
    LT_CHECK(type == "bailing_moe", source, ": model_type is '", type, "', lingtrain reads 'bailing_moe'");
  }
  LingConfig c;
  c.name = o.get<std::string>("lingtrain_preset", "custom");
  c.vocab_size = o.get<int64_t>("vocab_size");
  c.hidden_size = o.get<int64_t>("hidden_size");
  c.num_hidden_layers = o.get<int64_t>("num_hidden_layers");
  c.num_attention_heads = o.get<int64_t>("num_attention_heads");
  c.num_key_value_heads = o.get<int64_t>("num_key_value_heads", c.num_attention_heads);
  c.head_dim = o.get<int64_t>("head_dim", 0);
  c.intermediate_size = o.get<int64_t>("intermediate_size", 0);
  c.moe_intermediate_size = o.get<int64_t>("moe_intermediate_size", 0);
  c.num_experts = o.get<int64_t>("num_experts", 0);
  c.num_shared_experts = o.get<int64_t>("num_shared_experts", 0);
  c.num_experts_per_tok = o.get<int64_t>("num_experts_per_tok", 2);
  c.norm_topk_prob = o.get<bool>("norm_topk_prob", true);
  c.first_k_dense_replace = o.get<int64_t>("first_k_dense_replace", 0);
  c.rms_norm_eps = o.get<double>("rms_norm_eps", 1e-5);
  c.rope_theta = o.get<double>("rope_theta", 10000.0);
  c.max_position_embeddings = o.get<int64_t>("max_position_embeddings", 16384);
  c.norm_head = o.get<bool>("norm_head", false);
  c.tie_word_embeddings = o.get<bool>("tie_word_embeddings", false);
  c.use_bias = o.get<bool>("use_bias", false);
  c.use_qkv_bias = o.get<bool>("use_qkv_bias", false);
  c.initializer_range = o.get<double>("initializer_range", 0.02);
  c.pad_token_id = o.get<int64_t>("pad_token_id", 126081);
  c.eos_token_id = o.get<int64_t>("eos_token_id", c.pad_token_id);
  c.aux_loss_coef = o.get<double>("aux_loss_coef", 0.015);
  c.z_loss_coef = o.get<double>("z_loss_coef", 1e-4);
  const std::string grad = o.get<std::string>("norm_head_grad", "detached");
  LT_CHECK(grad == "detached" || grad == "full", source, ": norm_head_grad must be 'detached' or 'full', got '",
           grad, "'");
  c.norm_head_grad = grad == "full" ? NormHeadGrad::Full : NormHeadGrad::Detached;
  if (o.has("rope_scaling")) fail(source, ": rope_scaling is not supported yet");
  c.validate(source);
  return c;
}

LingConfig load_config(const std::string& path) { return config_from_json(read_json_file(path), path); }

Json config_to_json(const LingConfig& c) {
  Json j;
  j["architectures"] = Json::array({"BailingMoeForCausalLM"});
  j["model_type"] = "bailing_moe";
  j["torch_dtype"] = "float32";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.resolved_head_dim();
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_experts"] = c.num_experts;
  j["num_shared_experts"] = c.num_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["norm_head"] = c.norm_head;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["use_bias"] = c.use_bias;
  j["use_qkv_bias"] = c.use_qkv_bias;
  j["initializer_range"] = c.initializer_range;
  j["pad_token_id"] = c.pad_token_id;
  j["eos_token_id"] = c.eos_token_id;
  j["aux_loss_coef"] = c.aux_loss_coef;
  j["z_loss_coef"] = c.z_loss_coef;
  j["norm_head_grad"] = c.norm_head_grad == NormHeadGrad::Full ? "full" : "detached";
  j["lingtrain_preset"] = c.name;
  return j;
}

LingConfig resolve_config(const std::string& preset_or_path) {
  std::string presets;
  for (const std::string& name : preset_names()) {
    if (name == preset_or_path) return preset_config(name);
    presets += (presets.empty() ? "" : ", ") + name;
  }
  // A bare name that is no preset is a typo far more often than a config file in the working folder.
  LT_CHECK(preset_or_path.find('/') != std::string::npos || preset_or_path.find(".json") != std::string::npos ||
               std::filesystem::exists(preset_or_path),
           "unknown model '", preset_or_path, "' (presets: ", presets, "; or the path of a config.json)");
  return load_config(preset_or_path);
}

}  // namespace lt
