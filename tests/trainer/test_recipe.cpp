// Recipes and the training state: parsing with located errors, the built-in tiny recipe's theta switch,
// the stage token budget under a batch ramp (the wsd halving point), and the TrainState JSON round
// trip with the model's buffers.
#include <gtest/gtest.h>

#include <set>

#include "model/ling.h"
#include "trainer/recipe.h"
#include "trainer/train_state.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

std::string error_of(const Json& json) {
  try {
    Recipe::from_json(json, "r.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Recipe, DefaultsAndRoundTrip) {
  const Recipe r = Recipe::from_json(Json{{"stages", Json::array({Json::object()})}}, "r.json");
  ASSERT_EQ(r.stages.size(), 1u);
  EXPECT_EQ(r.model, "tiny");
  EXPECT_EQ(r.stages[0].steps, 1500);
  EXPECT_EQ(r.stages[0].schedule().kind, "cosine");
  EXPECT_EQ(r.stages[0].schedule().total_steps, 1500);
  EXPECT_EQ(Recipe::from_json(r.to_json(), "again").to_json(), r.to_json());
}

TEST(Recipe, TinyRecipeSwitchesThetaAndContext) {
  const Recipe r = resolve_recipe("tiny");
  ASSERT_EQ(r.stages.size(), 3u);
  EXPECT_EQ(r.stages[0].rope_theta, 10000);
  EXPECT_EQ(r.stages[1].rope_theta, 600000);
  EXPECT_GT(r.stages[1].seq, r.stages[0].seq);
  EXPECT_EQ(r.stages[0].schedule().kind, "wsd");
  EXPECT_EQ(r.stages[2].schedule().kind, "inverse_sqrt");
  EXPECT_LE(r.stages[1].seq, preset_config(r.model).max_position_embeddings);
}

TEST(Recipe, ErrorsNameTheKey) {
  EXPECT_NE(error_of(Json{{"stages", Json::array()}}).find("stages"), std::string::npos);
  EXPECT_NE(error_of(Json{{"stages", Json::array({{{"stepz", 3}}})}}).find("stepz"), std::string::npos);
  EXPECT_NE(error_of(Json{{"stages", Json::array({{{"steps", "many"}}})}}).find("steps"), std::string::npos);
  EXPECT_NE(error_of(Json{{"stages", Json::array({{{"lr_schedule", "linear"}}})}}).find("linear"), std::string::npos);
  EXPECT_NE(error_of(Json{{"stages", Json::array({Json::object()})}, {"sed", 1}}).find("sed"), std::string::npos);
  const std::string where = error_of(Json{{"stages", Json::array({Json::object(), {{"batch", 0}}})}});
  EXPECT_NE(where.find("stage 1"), std::string::npos) << where;
}

TEST(StageSettings, KindIsParsedOnceAndNamed) {
  for (StageKind kind : {StageKind::Pretrain, StageKind::Sft, StageKind::Dpo})
    EXPECT_EQ(parse_stage_kind(stage_kind_name(kind), "r.json"), kind);
  test::expect_error([] { parse_stage_kind("rlhf", "r.json: stage 0"); },
                     {"r.json: stage 0: kind must be pretrain, sft or dpo, got 'rlhf'"});
}

// Checkpoints hold their recipe: a pre-training stage writes the keys it wrote before post-training
// existed, and the model's own loss weights stay out until a stage sets them.
TEST(StageSettings, APretrainingStageWritesTheKeysItAlwaysWrote) {
  const Json pretrain = stage_to_json(StageSettings{});
  std::set<std::string> keys;
  for (const auto& [key, value] : pretrain.items()) keys.insert(key);
  EXPECT_EQ(keys, (std::set<std::string>{"name", "steps", "batch", "seq", "accum", "rope_theta", "data",
                                         "on_exhausted", "val",
                                         "lr_schedule", "lr", "min_lr", "warmup_steps", "halve_at",
                                         "batch_warmup_start", "batch_warmup_steps", "clip", "weight_decay"}));
  StageSettings weighted;
  weighted.aux_loss_coef = 0.01;
  const Json json = stage_to_json(weighted);
  EXPECT_EQ(json.at("aux_loss_coef").get<double>(), 0.01);
  EXPECT_FALSE(json.contains("z_loss_coef"));
}

TEST(StageSettings, PostTrainingStagesWriteTheirKeysAndReadBack) {
  StageSettings sft = stage_defaults(StageKind::Sft);
  sft.data = DataSpec::from_json("c.jsonl", "test");
  const Json sft_json = stage_to_json(sft);
  EXPECT_EQ(sft_json.at("kind"), "sft");
  EXPECT_EQ(sft_json.at("epochs").get<double>(), 2.0);
  EXPECT_FALSE(sft_json.contains("beta") || sft_json.contains("reference"));
  EXPECT_EQ(stage_to_json(stage_from_json(JsonObject(sft_json, "s"), "s")), sft_json);
  StageSettings dpo = stage_defaults(StageKind::Dpo);
  dpo.data = DataSpec::from_json("p.jsonl", "test");
  dpo.reference = "ckpt";
  const Json dpo_json = stage_to_json(dpo);
  for (const char* key : {"kind", "epochs", "beta", "rpo_alpha", "reference"}) EXPECT_TRUE(dpo_json.contains(key)) << key;
  EXPECT_EQ(stage_to_json(stage_from_json(JsonObject(dpo_json, "d"), "d")), dpo_json);
}

TEST(StageSettings, DataIsFilesOrAMixtureOfNamedWeightedSources) {
  const DataSpec plain = DataSpec::from_json("a/*.bin,b.bin", "t");
  EXPECT_FALSE(plain.is_mixture());
  EXPECT_EQ(plain.path(), "a/*.bin,b.bin");
  EXPECT_EQ(plain.to_json(), "a/*.bin,b.bin");
  const DataSpec flag = DataSpec::from_json("web@0.7=web/*.bin;code@0.3=c1.bin,c2.bin", "t");
  ASSERT_EQ(flag.sources.size(), 2u);
  EXPECT_EQ(flag.sources[1], (DataSource{"code", "c1.bin,c2.bin", 0.3}));
  const Json listed = parse_json(R"([{"name": "web", "path": "web/*.bin", "weight": 0.7},
                                     {"name": "code", "path": "c1.bin,c2.bin", "weight": 0.3}])", "t");
  EXPECT_EQ(DataSpec::from_json(listed, "t"), flag);
  EXPECT_EQ(flag.to_json(), listed);
  EXPECT_TRUE(DataSpec::from_json(parse_json(R"([{"name": "only", "path": "x.bin"}])", "t"), "t").is_mixture());

  test::expect_error([] { DataSpec::from_json("web@x=a.bin;code@1=b.bin", "stage 0: data"); },
                     {"stage 0: data: source 'web': weight 'x' is not a number"});
  test::expect_error([] { DataSpec::from_json("web@0=a.bin;code@1=b.bin", "d"); }, {"source 'web' has weight 0"});
  test::expect_error([] { DataSpec::from_json("web@1=a.bin;web@1=b.bin", "d"); }, {"source name 'web' appears twice"});
  test::expect_error([] { DataSpec::from_json("web@1=a.bin;b.bin", "d"); }, {"source 1 needs a name"});
  test::expect_error([] { DataSpec::from_json("web@1=", "d"); }, {"source 'web' names no files"});
  test::expect_error([] { DataSpec::from_json(parse_json(R"([{"name": "w", "path": "a", "wieght": 1}])", "t"), "d"); },
                     {"unknown key 'wieght'"});
  test::expect_error([] { DataSpec::from_json(parse_json("42", "t"), "d"); },
                     {"d: must be a string (files) or a list"});
  Json sft = stage_to_json(stage_defaults(StageKind::Sft));
  sft["data"] = listed;
  test::expect_error([&] { stage_from_json(JsonObject(sft, "s"), "s"); }, {"a mixture of sources is for pre-training"});
  Json pretrain = stage_to_json(StageSettings{});
  pretrain["on_exhausted"] = "stop";
  test::expect_error([&] { stage_from_json(JsonObject(pretrain, "p"), "p"); }, {"on_exhausted must be repeat or end"});
}

TEST(StageSettings, EachCommandStartsFromItsKindsDefaults) {
  const StageSettings pretrain = stage_defaults(StageKind::Pretrain), sft = stage_defaults(StageKind::Sft),
                      dpo = stage_defaults(StageKind::Dpo);
  EXPECT_EQ(stage_to_json(pretrain), stage_to_json(StageSettings{}));
  EXPECT_EQ(sft.kind, StageKind::Sft);
  EXPECT_EQ(sft.name, "sft");
  EXPECT_EQ(sft.seq, 512);
  EXPECT_EQ(sft.batch, 8);
  EXPECT_EQ(sft.lr, 1e-3);
  EXPECT_EQ(sft.min_lr, 1e-4);
  EXPECT_EQ(sft.warmup_steps, 10);
  EXPECT_EQ(sft.weight_decay, 0.0);
  EXPECT_EQ(sft.epochs, 2.0);
  EXPECT_EQ(sft.steps, 0);
  EXPECT_EQ(dpo.kind, StageKind::Dpo);
  EXPECT_EQ(dpo.seq, 1024);
  EXPECT_EQ(dpo.batch, 4);
  EXPECT_EQ(dpo.lr, 2e-4);
  EXPECT_EQ(dpo.min_lr, 2e-5);
  EXPECT_EQ(dpo.warmup_steps, 5);
  EXPECT_EQ(dpo.epochs, 1.0);
  EXPECT_EQ(dpo.beta, 0.1);
  EXPECT_EQ(dpo.rpo_alpha, 0.05);
}

TEST(StageSettings, TheTableNamesEachKeyOnce) {
  std::set<std::string> keys, fixed;
  for (const StageKey& k : stage_keys()) {
    EXPECT_TRUE(keys.insert(k.key).second) << k.key;
    EXPECT_NE(std::string(k.help), "") << k.key;
    if (k.has(kFixedMidStage)) fixed.insert(k.key);
  }
  EXPECT_EQ(fixed, (std::set<std::string>{"accum", "batch", "seq"}));
}

// Caught by UBSan under tests/fuzz/fuzz_trainer_json: sizes whose products overflow int64 (undefined behaviour in
// the batch ramp, the token budget and the step total) are refused when the recipe is read.
TEST(Recipe, SizesBeyondA64BitTokenCountAreRefused) {
  const int64_t huge = int64_t{1} << 62;
  auto recipe_with = [](Json stages) { return Json{{"stages", stages}}; };
  test::expect_error([&] { Recipe::from_json(recipe_with(Json::array({{{"batch", huge}, {"seq", 4}}})), "r.json"); },
                     {"r.json: stage 0: steps x batch x accum x seq exceed a 64-bit token count"});
  test::expect_error(
      [&] { Recipe::from_json(recipe_with(Json::array({{{"steps", 10}, {"batch_warmup_start", huge}}})), "r.json"); },
      {"r.json: stage 0: steps x batch x accum x seq exceed a 64-bit token count"});
  const Json half = {{"steps", huge / 2}, {"batch", 1}, {"seq", 1}};  // each fits alone, not both together
  test::expect_error([&] { Recipe::from_json(recipe_with(Json::array({half, half})), "r.json"); },
                     {"r.json: the stages together exceed a 64-bit token count"});
}

// Found by tests/fuzz/fuzz_trainer_json (a timeout): the token budget walked every step of the stage.
TEST(Recipe, StageTokensOfALongStageAreCountedAtOnce) {
  StageSettings s;
  s.steps = int64_t{1} << 40;  // a walk would take hours; the sums stay exact in a double
  s.batch = 2;
  s.seq = 3;
  s.accum = 5;
  EXPECT_EQ(s.total_tokens(), static_cast<double>(s.steps) * 2 * 3 * 5);
  s.batch_warmup_start = 2;
  s.batch_warmup_steps = 4;  // micro-batches 1, 2, 3, 4, then 5 for the rest
  EXPECT_EQ(s.total_tokens(), (1 + 2 + 3 + 4 + static_cast<double>(s.steps - 4) * 5) * 2 * 3);
}

TEST(Recipe, StageTokensFollowTheBatchRamp) {
  StageSettings s;
  s.steps = 10;
  s.batch = 4;
  s.seq = 8;
  s.accum = 2;  // full batch: 8 sequences = 2 micro-batches
  EXPECT_EQ(s.total_tokens(), 10.0 * 8 * 8);
  s.batch_warmup_start = 4;
  s.batch_warmup_steps = 4;  // steps 0..3 ramp 4 -> 8 sequences: micro-batches 1, 2 (5 -> 2), 2, 2
  EXPECT_EQ(s.micro_batches_at(0), 1);
  EXPECT_EQ(s.micro_batches_at(4), 2);
  double expected = 0;
  for (int64_t i = 0; i < s.steps; ++i) expected += static_cast<double>(s.micro_batches_at(i) * 4 * 8);
  EXPECT_EQ(s.total_tokens(), expected);
  EXPECT_LT(s.total_tokens(), 10.0 * 8 * 8);  // the old budget assumed the full batch from step 0
}

TEST(TrainState, JsonRoundTripWithBuffers) {
  class WithBuffer : public Module {
   public:
    WithBuffer() : stats(add_buffer("stats", Tensor::from_vector<double>({3}, {0.1, 1.0 / 3.0, 1.0}))) {}
    Tensor& stats;
  };
  WithBuffer a, b;
  TrainState state;
  state.step = 7;
  state.tokens_seen = 900;
  state.stage = 1;
  state.stage_step = 2;
  state.stage_tokens = 300;
  state.data_cursor = {{3, 5, 40}};
  a.stats.data<double>()[1] = 2.0 / 7.0;
  const Json json = parse_json(train_state_to_json(state, a).dump(), "dumped");
  TrainState back;
  train_state_from_json(json, "s.json", back, b);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.tokens_seen, 900);
  EXPECT_EQ(back.stage, 1);
  EXPECT_EQ(back.stage_step, 2);
  EXPECT_EQ(back.stage_tokens, 300);
  EXPECT_EQ(back.data_cursor, (DataCursor{{3, 5, 40}}));
  // A mixture's cursor holds one entry per source.
  state.data_cursor = {{1, 2, 3}, {4, 5, 6}};
  train_state_from_json(parse_json(train_state_to_json(state, a).dump(), "dumped"), "s.json", back, b);
  EXPECT_EQ(back.data_cursor, state.data_cursor);
  EXPECT_EQ(b.stats.to_vector<double>(), a.stats.to_vector<double>());  // exact, through 17 digits

  Json missing = json;
  missing["module_buffers"].erase("stats");
  EXPECT_THROW(train_state_from_json(missing, "s.json", back, b), Error);
  Json extra = json;
  extra["module_buffers"]["other"] = json["module_buffers"]["stats"];
  EXPECT_THROW(train_state_from_json(extra, "s.json", back, b), Error);
}

// Found by tests/fuzz/fuzz_trainer_json: an integer field holding a number that nlohmann stores as a
// double (one past UINT64_MAX, 1e300) used to be cast without a range check, undefined behaviour.
TEST(TrainState, OutOfRangeIntegersAreCleanErrors) {
  class WithBuffer : public Module {
   public:
    WithBuffer() { add_buffer("stats", Tensor::from_vector<double>({3}, {0.0, 1.0, 0.0})); }
  };
  WithBuffer model;
  TrainState state;
  const Json good = parse_json(train_state_to_json(state, model).dump(), "dumped");

  // A checkpoint from before the warmup noise was drawn per token kept a generator's state: ignored.
  Json with_old_rng = good;
  with_old_rng["rng"]["routing"]["words"][3] = parse_json("18446744073709551716", "literal");
  EXPECT_NO_THROW(train_state_from_json(with_old_rng, "s.json", state, model));
  Json shape_float = good;
  shape_float["module_buffers"]["stats"]["shape"] = Json::array({1e300});
  test::expect_error([&] { train_state_from_json(shape_float, "s.json", state, model); },
                     {"s.json: buffer 'stats' shape must be an integer, got 1e+300"});
  Json shape_scalar = good;
  shape_scalar["module_buffers"]["stats"]["shape"] = 3;
  test::expect_error([&] { train_state_from_json(shape_scalar, "s.json", state, model); },
                     {"s.json: buffer 'stats' shape must be a list, got 3"});
}

}  // namespace
}  // namespace lt
