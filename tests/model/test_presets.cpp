// The model presets (model/presets/*.json, embedded at build time): they give exactly the configs the
// code built before they became files, the files are in config_to_json's form, and the released
// shapes match the Ling configs (docs/architecture.md §2.1, §2.2).
#include <gtest/gtest.h>

#include "model/config.h"
#include "model/preset_texts.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

// Counts and the raw head_dim (0 = unset: hidden / heads) of each preset as the former chain of
// conditionals in model/config.cpp built it; ling-plus has the corrected heads (42/6 instead of 56/8),
// which keep every weight shape and so the counts.
struct PresetFacts {
  const char* name;
  int64_t head_dim, total, active;
};
constexpr PresetFacts kFacts[] = {
    {"dense-124m", 64, 162148608, 162148608},
    {"ling-lite-4l", 0, 2844280832, 837306368},  // ling-lite's first four layers: a GPU bench shape
    {"ling-lite", 0, 16801974272, 2753153024},
    {"ling-plus", 0, 290602910976, 29004170496},
    {"moe-m", 64, 109306368, 32236032},
    {"moe-s", 32, 9849088, 5130496},
    {"small", 0, 8224000, 3800320},
    {"tiny", 0, 1093760, 651392},
};

TEST(Presets, NamesAreTheFilesSorted) {
  std::vector<std::string> expected;
  for (const PresetFacts& facts : kFacts) expected.emplace_back(facts.name);
  EXPECT_EQ(preset_names(), expected);
}

TEST(Presets, ShapesAndCountsAreUnchanged) {
  for (const PresetFacts& facts : kFacts) {
    SCOPED_TRACE(facts.name);
    const LingConfig c = preset_config(facts.name);
    EXPECT_EQ(c.name, facts.name);
    EXPECT_EQ(c.head_dim, facts.head_dim);
    const ParameterCount count = count_parameters(c);
    EXPECT_EQ(count.total, facts.total);
    EXPECT_EQ(count.active, facts.active);
  }
}

// The default model: a bit-for-bit `make train` needs every field as before, training knobs included.
TEST(Presets, TinyIsExactlyTheFormerConfig) {
  const LingConfig c = preset_config("tiny");
  EXPECT_EQ(c.head_dim, 0);  // derived: small_config() in test_model.cpp resizes hidden/heads from tiny
  EXPECT_EQ(config_to_json(c).dump(),
            R"({"architectures":["BailingMoeForCausalLM"],"aux_loss_coef":0.015,"eos_token_id":256,)"
            R"("first_k_dense_replace":1,"head_dim":32,"hidden_act":"silu","hidden_size":128,)"
            R"("initializer_range":0.02,"intermediate_size":384,"lingtrain_preset":"tiny",)"
            R"("max_position_embeddings":256,"model_type":"bailing_moe","moe_intermediate_size":64,)"
            R"("norm_head":true,"norm_head_grad":"detached","norm_topk_prob":true,"num_attention_heads":4,)"
            R"("num_experts":8,"num_experts_per_tok":2,"num_hidden_layers":4,"num_key_value_heads":2,)"
            R"("num_shared_experts":1,"pad_token_id":256,"rms_norm_eps":1e-06,"rope_scaling":null,)"
            R"("rope_theta":10000.0,"tie_word_embeddings":false,"torch_dtype":"float32","use_bias":false,)"
            R"("use_qkv_bias":false,"vocab_size":320,"z_loss_coef":0.0001})");
}

// Each file is what config_to_json writes for its config (keys sorted, 2-space indent), except that
// an unset head_dim stays absent as in the released Ling configs; so the files hold no key the
// reader ignores and no value it would round differently.
TEST(Presets, FilesAreInConfigToJsonForm) {
  for (const PresetText& preset : preset_texts()) {
    SCOPED_TRACE(std::string(preset.name));
    const LingConfig c = preset_config(std::string(preset.name));
    Json canonical = config_to_json(c);
    if (c.head_dim == 0) canonical.erase("head_dim");
    EXPECT_EQ(preset.json, canonical.dump(2) + "\n");
    EXPECT_EQ(c.name, preset.name);
  }
}

TEST(Presets, UnknownNameListsThePresets) {
  test::expect_error([] { preset_config("ling-max"); },
                     {"unknown model preset 'ling-max'", "presets: dense-124m, ling-lite-4l, ling-lite, ling-plus, moe-m, moe-s, "
                                                         "small, tiny"});
}

// The fields both released configs share (docs/architecture.md §2.1, §2.2).
void expect_released_ling(const LingConfig& c) {
  EXPECT_EQ(c.vocab_size, 126464);
  EXPECT_EQ(c.pad_token_id, 126081);
  EXPECT_EQ(c.eos_token_id, 126081);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 600000.0);
  EXPECT_EQ(c.max_position_embeddings, 16384);
  EXPECT_TRUE(c.norm_head);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.use_bias);
  EXPECT_FALSE(c.use_qkv_bias);
  EXPECT_EQ(c.initializer_range, 0.006);
}

TEST(Presets, LingLiteIsTheReleasedConfig) {
  const LingConfig c = preset_config("ling-lite");
  expect_released_ling(c);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.resolved_head_dim(), 128);
  EXPECT_EQ(c.intermediate_size, 5632);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.num_experts_per_tok, 6);
}

TEST(Presets, LingPlusIsTheReleasedConfig) {
  const LingConfig c = preset_config("ling-plus");
  expect_released_ling(c);
  EXPECT_EQ(c.hidden_size, 5376);
  EXPECT_EQ(c.num_hidden_layers, 88);
  EXPECT_EQ(c.num_attention_heads, 42);
  EXPECT_EQ(c.num_key_value_heads, 6);
  EXPECT_EQ(c.resolved_head_dim(), 128);  // 5376 / 42
  EXPECT_EQ((c.num_attention_heads + 2 * c.num_key_value_heads) * c.resolved_head_dim(), 6912);  // QKV rows
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.moe_intermediate_size, 3072);
  EXPECT_EQ(c.num_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  // docs/architecture.md §2.5: 290.6B total, 29.0B active.
  const ParameterCount count = count_parameters(c);
  EXPECT_NEAR(count.total / 1e9, 290.6, 0.1);
  EXPECT_NEAR(count.active / 1e9, 29.0, 0.1);
}

}  // namespace
}  // namespace lt
