// The Ling model: parameter counts of the real configs, config.json round trips and errors, Hugging
// Face names, checkpoint round trips, and KV-cached generation agreeing with the full forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "autograd/ops.h"
#include "model/hf_names.h"
#include "model/ling.h"
#include "tensor/kernels.h"
#include "tests/io/temp_dir.h"
#include "tests/model/small_config.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace lt {
namespace {

using test::small_config;

std::string temp_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "lingtrain-model-XXXXXX").string();
  return mkdtemp(pattern.data());
}

TEST(LingConfig, RealModelParameterCountsMatchTheReport) {
  // docs/architecture.md §2.5: Ling-Lite 16.802B total / 2.753B active; Ling-Plus 290.6B / 29.0B.
  const ParameterCount lite = count_parameters(preset_config("ling-lite"));
  EXPECT_NEAR(lite.total / 1e9, 16.802, 0.001);
  EXPECT_NEAR(lite.active / 1e9, 2.753, 0.001);
  const ParameterCount plus = count_parameters(preset_config("ling-plus"));
  EXPECT_NEAR(plus.total / 1e9, 290.6, 0.1);
  EXPECT_NEAR(plus.active / 1e9, 29.0, 0.1);
}

TEST(LingConfig, CountMatchesTheBuiltModel) {
  for (const char* name : {"tiny", "moe-s"}) {
    LingForCausalLM model(preset_config(name), 1);
    EXPECT_EQ(model.parameter_count(), count_parameters(model.config()).total) << name;
  }
}

TEST(LingConfig, JsonRoundTripAndErrors) {
  const LingConfig c = preset_config("small");
  const LingConfig back = config_from_json(config_to_json(c), "test");
  EXPECT_EQ(config_to_json(back).dump(), config_to_json(c).dump());
  Json bad = config_to_json(c);
  bad["num_key_value_heads"] = 3;
  EXPECT_THROW(config_from_json(bad, "cfg.json"), Error);
  bad = config_to_json(c);
  bad["hidden_size"] = "wide";
  try {
    config_from_json(bad, "cfg.json");
    FAIL() << "a string hidden_size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_config("no-such-preset-or-file"), Error);
}

// Caught by UBSan under tests/fuzz/fuzz_config: sizes from a file overflowed the int64 count (undefined behaviour),
// and the count walked the layers one by one, however many the file asked for.
TEST(LingConfig, SizesBeyondA64BitCountAreCleanErrors) {
  Json huge = config_to_json(preset_config("tiny"));
  huge["vocab_size"] = int64_t{1} << 62;
  test::expect_error([&] { config_from_json(huge, "cfg.json"); },
                     {"cfg.json: the sizes give more parameters than a 64-bit count holds"});

  auto count_with_layers = [](int64_t layers) {
    Json deep = config_to_json(preset_config("tiny"));
    deep["num_hidden_layers"] = layers;
    return count_parameters(config_from_json(deep, "cfg.json"));
  };
  const ParameterCount four = count_with_layers(4), five = count_with_layers(5);
  const int64_t many = int64_t{1} << 40;
  const ParameterCount deep = count_with_layers(many);  // past the dense first layer, each adds the same
  EXPECT_EQ(deep.total, four.total + (many - 4) * (five.total - four.total));
  EXPECT_EQ(deep.active, four.active + (many - 4) * (five.active - four.active));
}

TEST(HfNames, ExpertsAreSplitUnderHuggingFaceNames) {
  LingForCausalLM model(small_config(), 1);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : hf_state_dict(model)) shapes[name] = t.shape();
  const LingConfig& c = model.config();
  EXPECT_EQ(shapes.at("model.word_embeddings.weight"), (Shape{c.vocab_size, 32}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (Shape{c.vocab_size, 32}));
  EXPECT_EQ(shapes.at("model.layers.0.attention.query_key_value.weight"), (Shape{(4 + 2 * 2) * 8, 32}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (Shape{48, 32}));  // first_k_dense_replace = 1
  EXPECT_EQ(shapes.at("model.layers.1.mlp.gate.weight"), (Shape{4, 32}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.experts.3.down_proj.weight"), (Shape{32, 16}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.shared_experts.up_proj.weight"), (Shape{16, 32}));
  EXPECT_EQ(shapes.at("model.norm.weight"), (Shape{32}));
  EXPECT_EQ(shapes.count("model.layers.1.mlp.experts.gate_proj.weight"), 0u);
  // Gate and up, one fused weight in lingtrain, are apart under their Hugging Face names.
  EXPECT_EQ(shapes.at("model.layers.0.mlp.up_proj.weight"), (Shape{48, 32}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.experts.3.gate_proj.weight"), (Shape{16, 32}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.experts.3.up_proj.weight"), (Shape{16, 32}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.shared_experts.gate_proj.weight"), (Shape{16, 32}));
  for (const auto& [name, shape] : shapes) EXPECT_EQ(name.find("gate_up"), std::string::npos) << name;
}

// The Hugging Face gate_proj and up_proj are the first and the second half of the rows of lingtrain's fused
// gate_up_proj, expert by expert; and they hold what two separate projections drawn gate first would hold.
TEST(HfNames, GateAndUpAreTheHalvesOfTheFusedWeight) {
  LingForCausalLM model(small_config(), 1);
  std::map<std::string, Tensor> hf;
  for (const auto& [name, t] : hf_state_dict(model)) hf[name] = t;
  std::map<std::string, Tensor> params;
  for (const Parameter& p : model.parameters()) params[p.name] = p.value->value();
  const Tensor experts = params.at("model.layers.1.mlp.experts.gate_up_proj.weight");  // [E, 2I, H]
  ASSERT_EQ(experts.shape(), (Shape{4, 32, 32}));
  const std::vector<float> expert3 = experts.narrow(3, 1).to_vector<float>();
  const std::vector<float> gate3 = hf.at("model.layers.1.mlp.experts.3.gate_proj.weight").to_vector<float>();
  const std::vector<float> up3 = hf.at("model.layers.1.mlp.experts.3.up_proj.weight").to_vector<float>();
  EXPECT_EQ(std::vector<float>(expert3.begin(), expert3.begin() + 16 * 32), gate3);
  EXPECT_EQ(std::vector<float>(expert3.begin() + 16 * 32, expert3.end()), up3);
  const Tensor dense = params.at("model.layers.0.mlp.gate_up_proj.weight");  // [2I, H]
  ASSERT_EQ(dense.shape(), (Shape{96, 32}));
  EXPECT_EQ(dense.narrow(48, 48).to_vector<float>(), hf.at("model.layers.0.mlp.up_proj.weight").to_vector<float>());

  Rng rng(5), same(5);
  const Tensor fused = init_gate_up({2, 3, 4}, 0.5, rng);
  const Tensor gate = init_normal({2, 3, 4}, 0.5, same), up = init_normal({2, 3, 4}, 0.5, same);
  ASSERT_EQ(fused.shape(), (Shape{2, 6, 4}));
  for (int64_t e = 0; e < 2; ++e) {
    const Tensor rows = fused.narrow(e, 1).reshape({6, 4});
    EXPECT_EQ(rows.narrow(0, 3).to_vector<float>(), gate.narrow(e, 1).to_vector<float>()) << "expert " << e;
    EXPECT_EQ(rows.narrow(3, 3).to_vector<float>(), up.narrow(e, 1).to_vector<float>()) << "expert " << e;
  }
}

TEST(Checkpoint, RoundTripRestoresEveryWeight) {
  const std::string dir = temp_dir();
  LingForCausalLM a(small_config(), 1), b(small_config(), 2);
  save_checkpoint(dir + "/ckpt", a, nullptr, Json{{"step", 0}});
  load_checkpoint_weights(dir + "/ckpt", b);
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].value->value().to_vector<float>(), pb[i].value->value().to_vector<float>()) << pa[i].name;
  // A config whose shapes differ is refused with the tensor's name.
  LingConfig wider = small_config();
  wider.moe_intermediate_size = 24;
  LingForCausalLM c(wider, 1);
  try {
    load_checkpoint_weights(dir + "/ckpt", c);
    FAIL() << "mismatched shapes were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Generation, KVCachedLogitsMatchTheFullForward) {
  LingForCausalLM model(small_config(), 3);
  NoGradGuard no_grad;
  const std::vector<int32_t> ids = {256, 72, 101, 108, 108, 111, 44, 32, 119};
  const int64_t T = static_cast<int64_t>(ids.size());
  MoEContext full_context;
  const std::vector<float> full =
      model.logits(Tensor::from_vector<int32_t>({1, T}, ids), full_context).value().to_vector<float>();
  // Prefill 5 tokens, then one at a time.
  std::vector<KVCache> caches = model.make_kv_caches(1, T);
  std::vector<float> cached;
  MoEContext context;
  const std::vector<int32_t> prefix(ids.begin(), ids.begin() + 5);
  auto first = model.logits(Tensor::from_vector<int32_t>({1, 5}, prefix), context, 0, &caches).value().to_vector<float>();
  cached.insert(cached.end(), first.begin(), first.end());
  for (int64_t t = 5; t < T; ++t) {
    MoEContext step_context;
    auto step = model.logits(Tensor::from_vector<int32_t>({1, 1}, {ids[t]}), step_context, 0, &caches)
                    .value()
                    .to_vector<float>();
    cached.insert(cached.end(), step.begin(), step.end());
  }
  ASSERT_EQ(cached.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_NEAR(cached[i], full[i], 1e-4) << "logit " << i;
}

// Prompts of different lengths prefilled together (the shorter padded after their ids) and then decoded a
// step together: each row's next-token logits are those of its own ids through a cache of its own.
TEST(Generation, NextTokenLogitsOfPaddedRowsMatchEachRowAlone) {
  LingForCausalLM model(small_config(), 7);
  NoGradGuard no_grad;
  const std::vector<std::vector<int32_t>> prompts = {{256, 72, 101, 108, 108}, {256, 9}, {256, 40, 41, 42}};
  const int64_t B = 3, T = 5, V = model.config().vocab_size;
  std::vector<int32_t> padded;
  std::vector<int64_t> lengths;
  for (const std::vector<int32_t>& prompt : prompts) {
    padded.insert(padded.end(), prompt.begin(), prompt.end());
    padded.insert(padded.end(), static_cast<size_t>(T) - prompt.size(), 7);
    lengths.push_back(static_cast<int64_t>(prompt.size()));
  }
  std::vector<KVCache> caches = model.make_kv_caches(B, T + 1);
  MoEContext context;
  const std::vector<float> prefill =
      model.next_token_logits(Tensor::from_vector<int32_t>({B, T}, padded), lengths, context, caches)
          .value()
          .to_vector<float>();
  for (KVCache& c : caches) c.length_B = lengths;
  const std::vector<int32_t> next = {3, 4, 5};
  MoEContext step_context;
  const std::vector<float> step =
      model.next_token_logits(Tensor::from_vector<int32_t>({B, 1}, next), {1, 1, 1}, step_context, caches)
          .value()
          .to_vector<float>();
  ASSERT_EQ(prefill.size(), static_cast<size_t>(B * V));
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> ids = prompts[b];
    const int64_t n = static_cast<int64_t>(ids.size());
    ids.push_back(next[b]);
    MoEContext alone_context;
    const std::vector<float> alone =
        model.logits(Tensor::from_vector<int32_t>({1, n + 1}, ids), alone_context).value().to_vector<float>();
    for (int64_t v = 0; v < V; ++v) {
      EXPECT_NEAR(prefill[b * V + v], alone[(n - 1) * V + v], 1e-4) << "prefill row " << b << " logit " << v;
      EXPECT_NEAR(step[b * V + v], alone[n * V + v], 1e-4) << "step row " << b << " logit " << v;
    }
  }
  const Tensor one_each = Tensor::from_vector<int32_t>({B, 1}, next);
  test::expect_error([&] { model.next_token_logits(one_each, {1, 2, 1}, context, caches); },
                     {"row 1 has length 2 of 1"});
}

// With the weights held constant (kernels::ReusedMatmulOperands, as generation holds them), a row's
// logits have the same bits whether it is prefilled and decoded with other rows or alone: on the CPU
// every GEMM of a few rows then takes the panel path, where a row's arithmetic does not depend on the
// others (the experts' segments, which differ with the batch, included). The prefill's attention keeps a
// row's bits whatever the padded length where the head dimension is whole vectors (16 here, as in the
// presets: 32 to 128).
TEST(Generation, RowsTogetherHaveTheBitsOfEachRowAloneWithTheWeightsHeld) {
  LingConfig config = small_config();
  config.hidden_size = 64;  // head_dim 16
  LingForCausalLM model(config, 8);
  NoGradGuard no_grad;
  std::vector<Tensor> weights;
  for (const Parameter& p : model.parameters()) weights.push_back(p.value->value());
  const kernels::ReusedMatmulOperands held(weights);
  const std::vector<std::vector<int32_t>> prompts = {{256, 72, 101, 108, 108, 111, 44}, {256, 9}, {256, 40, 41}};
  const int64_t B = 3, T = 7;
  // Prefill then two steps, through caches of `rows` rows; the logits of every row at every call.
  auto run = [&](const std::vector<int64_t>& rows) {
    const int64_t n = static_cast<int64_t>(rows.size());
    int64_t width = 0;
    for (int64_t r : rows) width = std::max<int64_t>(width, static_cast<int64_t>(prompts[r].size()));
    std::vector<int32_t> ids;
    std::vector<int64_t> lengths;
    for (int64_t r : rows) {
      ids.insert(ids.end(), prompts[r].begin(), prompts[r].end());
      ids.insert(ids.end(), static_cast<size_t>(width) - prompts[r].size(), 5);
      lengths.push_back(static_cast<int64_t>(prompts[r].size()));
    }
    std::vector<KVCache> caches = model.make_kv_caches(n, T + 2);
    std::vector<std::vector<float>> calls;
    MoEContext context;
    calls.push_back(model.next_token_logits(Tensor::from_vector<int32_t>({n, width}, ids), lengths, context, caches)
                        .value()
                        .to_vector<float>());
    for (KVCache& c : caches) c.length_B = lengths;
    for (int32_t step = 0; step < 2; ++step) {
      std::vector<int32_t> next;
      for (int64_t r : rows) next.push_back(static_cast<int32_t>(10 * r + step));
      MoEContext step_context;
      calls.push_back(model
                          .next_token_logits(Tensor::from_vector<int32_t>({n, 1}, next),
                                             std::vector<int64_t>(static_cast<size_t>(n), 1), step_context, caches)
                          .value()
                          .to_vector<float>());
    }
    return calls;
  };
  const std::vector<std::vector<float>> together = run({0, 1, 2});
  const size_t V = static_cast<size_t>(model.config().vocab_size);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<std::vector<float>> alone = run({b});
    for (size_t call = 0; call < alone.size(); ++call)
      EXPECT_EQ(std::vector<float>(together[call].begin() + b * V, together[call].begin() + (b + 1) * V), alone[call])
          << "row " << b << " call " << call;
  }
}

// Packing: two documents in one row, attending only within themselves, lose what each loses alone (the
// MoE routes each token on its own, and RoPE sees only distances, so nothing couples the two).
TEST(Packing, PackedDocumentsLoseWhatEachLosesAlone) {
  LingForCausalLM model(small_config(), 4);
  NoGradGuard no_grad;
  Rng rng(9);
  const int64_t a = 20, b = 30;
  std::vector<int32_t> ids(a + b), targets(a + b), starts(a + b);
  for (int64_t t = 0; t < a + b; ++t) {
    ids[t] = static_cast<int32_t>(rng.below(256));
    targets[t] = static_cast<int32_t>(rng.below(256));
    starts[t] = t < a ? 0 : static_cast<int32_t>(a);
  }
  targets[3] = -100;  // an ignored target counts in neither
  auto lm_sum = [&](int64_t begin, int64_t length, const Tensor& doc_start) {
    const std::vector<int32_t> part_ids(ids.begin() + begin, ids.begin() + begin + length);
    const std::vector<int32_t> part_targets(targets.begin() + begin, targets.begin() + begin + length);
    int64_t counted = 0;
    for (int32_t t : part_targets) counted += t != -100;
    MoEContext context;
    const LossBreakdown loss = model.loss(Tensor::from_vector<int32_t>({1, length}, part_ids),
                                          Tensor::from_vector<int32_t>({1, length}, part_targets), context, doc_start);
    return loss.lm.value().item() * static_cast<double>(counted);
  };
  const double packed = lm_sum(0, a + b, Tensor::from_vector<int32_t>({1, a + b}, starts));
  const double alone = lm_sum(0, a, Tensor()) + lm_sum(a, b, Tensor());
  EXPECT_NEAR(packed, alone, 1e-5 * std::abs(alone));
  // Without the mask the second document sees the first: a different loss.
  EXPECT_GT(std::abs(lm_sum(0, a + b, Tensor()) - alone), 1e-3);
}

TEST(Training, TheLossFallsOnARepeatedBatch) {
  LingForCausalLM model(small_config(), 4);
  TrainerSettings settings;
  settings.routing_warmup_steps = 5;
  settings.schedule.kind = "constant";
  settings.schedule.peak = 1e-2;
  Trainer trainer(model, settings);
  Rng rng(5);
  std::vector<int32_t> ids(2 * 17), targets(2 * 17);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng.below(200));
  for (size_t i = 0; i < ids.size(); ++i) targets[i] = i + 1 < ids.size() ? ids[i + 1] : -100;
  const std::vector<TokenBatch> batch = {
      {Tensor::from_vector<int32_t>({2, 17}, ids), Tensor::from_vector<int32_t>({2, 17}, targets)}};
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) (step == 0 ? first : last) = trainer.step(batch).lm_loss;
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  EXPECT_EQ(trainer.state().step, 30);
}

}  // namespace
}  // namespace lt
