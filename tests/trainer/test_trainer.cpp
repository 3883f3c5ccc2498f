// Trainer::step and its seams: the hook after backward sees this step's complete gradients in the flat
// buffer, the hook before the update sees the losses and gradient norm and may skip or retry, gradient
// accumulation over micro-batches equals one batch of them all, and the learning rate follows the
// schedule at the stage's position.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "io/safetensors.h"
#include "model/ling.h"
#include "tests/model/small_config.h"
#include "tests/trainer/trainer_test_util.h"
#include "tensor/kernels.h"
#include "tests/io/temp_dir.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace lt {
namespace {

using test::constant_lr;
using test::random_batch;
using test::small_config;
using test::values_of;

TEST(Trainer, HooksSeeTheStepAndMaySkipOrRetry) {
  LingForCausalLM model(small_config(), 1);
  Trainer trainer(model, constant_lr(1e-2));
  Rng rng(2);
  const std::vector<TokenBatch> batch = {random_batch(rng, 2, 8)};

  double norm_seen_after_backward = -1;
  trainer.hooks().after_backward = [&](FlatParameters& params) {
    Tensor sq = Tensor::empty({1});
    kernels::sum_squares(params.grads(), sq);
    norm_seen_after_backward = std::sqrt(sq.item());
  };
  UpdateDecision decision = UpdateDecision::Skip;
  StepStats seen;
  trainer.hooks().before_update = [&](const StepStats& stats) {
    seen = stats;
    return decision;
  };

  const std::vector<float> before = values_of(trainer);
  const StepStats skipped = trainer.step(batch);
  EXPECT_NEAR(norm_seen_after_backward, skipped.grad_norm, 1e-4 * skipped.grad_norm);
  EXPECT_EQ(seen.grad_norm, skipped.grad_norm);
  EXPECT_EQ(seen.lm_loss, skipped.lm_loss);
  EXPECT_TRUE(std::isfinite(seen.loss) && seen.loss > 0);
  EXPECT_EQ(values_of(trainer), before) << "a skipped step changed the parameters";
  EXPECT_EQ(trainer.state().step, 1);  // the skipped step and its data count as taken
  EXPECT_EQ(trainer.optimizer().steps_taken(), 0);

  decision = UpdateDecision::Retry;
  const StepStats retried = trainer.step(batch);
  EXPECT_EQ(retried.decision, UpdateDecision::Retry);
  EXPECT_EQ(values_of(trainer), before);
  EXPECT_EQ(trainer.state().step, 1);  // a retry does not count
  EXPECT_EQ(trainer.state().tokens_seen, 2 * 16);

  decision = UpdateDecision::Apply;
  trainer.step(batch);
  EXPECT_NE(values_of(trainer), before);
  EXPECT_EQ(trainer.state().step, 2);
  EXPECT_EQ(trainer.optimizer().steps_taken(), 1);
  EXPECT_FALSE(trainer.parameters().runs_with_grad(false).size()) << "gradients survived the step";
}

// Two micro-batches a and b in one step against one batch holding the rows of both: the same loss and
// gradients. The auxiliary losses are per micro-batch by design (docs/architecture.md §7.4), so they are
// off here: what accumulation must preserve is the mean language-model gradient.
void expect_accumulation_equals_one_batch(const TokenBatch& a, const TokenBatch& b) {
  TokenBatch both = {Tensor::zeros({4, 8}, DType::I32), Tensor::zeros({4, 8}, DType::I32)};
  for (auto [whole, half, row] : {std::tuple{both.inputs, a.inputs, 0}, {both.inputs, b.inputs, 2},
                                  {both.targets, a.targets, 0}, {both.targets, b.targets, 2}}) {
    Tensor rows = whole.narrow(row, 2);
    rows.copy_from(half);
  }
  LingConfig config = small_config();
  config.aux_loss_coef = config.z_loss_coef = 0;
  LingForCausalLM accumulated(config, 4), single(config, 4);
  Trainer t1(accumulated, constant_lr(1e-2)), t2(single, constant_lr(1e-2));
  std::vector<float> g1, g2;
  t1.hooks().after_backward = [&](FlatParameters& p) { g1 = p.grads().to_vector<float>(); };
  t2.hooks().after_backward = [&](FlatParameters& p) { g2 = p.grads().to_vector<float>(); };
  const StepStats s1 = t1.step({a, b}), s2 = t2.step({both});
  EXPECT_EQ(s1.micro_batches, 2);
  EXPECT_EQ(s1.tokens, s2.tokens);
  EXPECT_NEAR(s1.lm_loss, s2.lm_loss, 1e-5);
  EXPECT_NEAR(s1.grad_norm, s2.grad_norm, 1e-5 * s2.grad_norm);
  // The router figures of the step are those of all its tokens: the loads add up, the largest logit is
  // the largest of either micro-batch.
  ASSERT_FALSE(s2.moe_layers.empty());
  ASSERT_EQ(s1.moe_layers.size(), s2.moe_layers.size());
  for (size_t l = 0; l < s1.moe_layers.size(); ++l) {
    EXPECT_EQ(s1.moe_layers[l].tokens_per_expert, s2.moe_layers[l].tokens_per_expert);
    EXPECT_TRUE(std::isfinite(s2.moe_layers[l].max_logit));
    EXPECT_NEAR(s1.moe_layers[l].max_logit, s2.moe_layers[l].max_logit, 1e-5 * std::fabs(s2.moe_layers[l].max_logit));
  }
  ASSERT_EQ(g1.size(), g2.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(g1[i]) - g2[i]));
    largest = std::max(largest, std::fabs(static_cast<double>(g2[i])));
  }
  EXPECT_LT(worst, 1e-5 * largest);
}

// A batch's ids are checked on the host before any kernel sees them (a GPU then trusts them): one clear
// error naming the first bad id, and no step taken.
TEST(Trainer, BadIdsInABatchAreOneClearErrorBeforeTheStep) {
  LingForCausalLM model(small_config(), 1);
  Trainer trainer(model, test::constant_lr(1e-2));
  const int64_t vocab = small_config().vocab_size;
  const std::vector<float> before = test::values_of(trainer);
  TokenBatch bad_input = {Tensor::from_vector<int32_t>({1, 3}, {1, static_cast<int32_t>(vocab), 2}),
                          Tensor::from_vector<int32_t>({1, 3}, {1, 2, 3})};
  try {
    trainer.step({bad_input});
    ADD_FAILURE() << "a token id past the vocabulary was trained on";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "batch: token id " + std::to_string(vocab) + " at position 1 is outside the "
                                     "vocabulary [0, " + std::to_string(vocab) + ")");
  }
  TokenBatch bad_target = {Tensor::from_vector<int32_t>({1, 3}, {1, 2, 3}),
                           Tensor::from_vector<int32_t>({1, 3}, {-100, -1, 3})};
  try {
    trainer.step({bad_target});
    ADD_FAILURE() << "target -1 was trained on";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "batch: target id -1 at position 1 is outside the vocabulary [0, " +
                                         std::to_string(vocab) + ") and not -100");
  }
  EXPECT_EQ(test::values_of(trainer), before);
  EXPECT_EQ(trainer.state().step, 0);
}

TEST(Trainer, AccumulationEqualsOneLargeBatch) {
  Rng rng(3);
  expect_accumulation_equals_one_batch(random_batch(rng, 2, 8), random_batch(rng, 2, 8));
}

// SFT's token mean: micro-batches with different numbers of labelled targets, weighed by them, give
// the gradient of one batch holding all of them (an equal weighting would not: a is 8x sparser than b).
TEST(Trainer, MicroBatchesWeighedByTheirLabelledTokensEqualOneBatch) {
  Rng rng(6);
  TokenBatch a = random_batch(rng, 2, 8), b = random_batch(rng, 2, 8);
  std::vector<int32_t> sparse = a.targets.to_vector<int32_t>();
  for (size_t n = 0; n < sparse.size(); ++n)
    if (n % 8 != 3) sparse[n] = -100;
  a.targets = Tensor::from_vector<int32_t>({2, 8}, sparse);
  a.loss_units = 2;
  b.loss_units = 16;
  expect_accumulation_equals_one_batch(a, b);
}

TEST(Trainer, LearningRateFollowsTheStageSchedule) {
  LingForCausalLM model(small_config(), 5);
  TrainerSettings settings;
  settings.schedule.kind = "wsd";
  settings.schedule.peak = 1e-2;
  settings.schedule.warmup_steps = 2;
  settings.schedule.total_steps = 10;
  settings.schedule.halve_at_fraction = 0.5;
  settings.stage_total_tokens = 4 * 16;  // four steps of 16 tokens
  Trainer trainer(model, settings);
  Rng rng(6);
  const std::vector<TokenBatch> batch = {random_batch(rng, 2, 8)};
  std::vector<double> lrs;
  for (int i = 0; i < 4; ++i) lrs.push_back(trainer.step(batch).lr);
  EXPECT_DOUBLE_EQ(lrs[0], 0.5e-2);  // warmup
  EXPECT_DOUBLE_EQ(lrs[1], 1e-2);
  EXPECT_DOUBLE_EQ(lrs[2], 0.5e-2);  // half the stage's tokens consumed: halved
  EXPECT_EQ(trainer.state().stage_tokens, 4 * 16);
}

TEST(Trainer, CheckpointKeepsTheOptimizerUpdateCount) {
  LingForCausalLM model(small_config(), 7), restored(small_config(), 8);
  Trainer trainer(model, constant_lr(1e-2)), other(restored, constant_lr(1e-2));
  Rng rng(8);
  const std::vector<TokenBatch> batch = {random_batch(rng, 2, 8)};
  trainer.step(batch);
  trainer.hooks().before_update = [](const StepStats&) { return UpdateDecision::Skip; };
  trainer.step(batch);  // a skipped update: 2 steps, 1 update
  test::TempDir dir;
  save_checkpoint(dir.root() + "/ckpt", model, &trainer.optimizer(), Json::object());
  load_checkpoint_weights(dir.root() + "/ckpt", restored);
  load_checkpoint_optimizer(dir.root() + "/ckpt", restored, other.optimizer());
  EXPECT_EQ(other.optimizer().steps_taken(), 1);
  EXPECT_EQ(values_of(other), values_of(trainer));
  const auto a = trainer.optimizer().state(), b = other.optimizer().state();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].second.to_vector<float>(), b[i].second.to_vector<float>());
}

// --save-dtype bf16: model.safetensors holds bf16 tensors (half the bytes), the optimiser state stays
// f32, and loading gives the weights rounded to bf16.
TEST(Trainer, CheckpointWeightsCanBeSavedInBf16) {
  LingForCausalLM model(small_config(), 7), restored(small_config(), 8);
  Trainer trainer(model, constant_lr(1e-2));
  Rng rng(9);
  trainer.step({random_batch(rng, 2, 8)});
  test::TempDir dir;
  save_checkpoint(dir.root() + "/f32", model, &trainer.optimizer(), Json::object());
  save_checkpoint(dir.root() + "/bf16", model, &trainer.optimizer(), Json::object(), {}, {}, DType::BF16);
  const SafetensorsFile weights = load_safetensors(dir.root() + "/bf16/model.safetensors");
  for (const auto& [name, t] : weights.tensors) EXPECT_EQ(t.dtype(), DType::BF16) << name;
  for (const auto& [name, t] : load_safetensors(dir.root() + "/bf16/optimizer.safetensors").tensors)
    EXPECT_EQ(t.dtype(), DType::F32) << name;
  EXPECT_LT(std::filesystem::file_size(dir.root() + "/bf16/model.safetensors"),
            std::filesystem::file_size(dir.root() + "/f32/model.safetensors") * 6 / 10);
  load_checkpoint_weights(dir.root() + "/bf16", restored);
  const Tensor values = model.parameters()[0].value->value(), loaded = restored.parameters()[0].value->value();
  EXPECT_EQ(loaded.to_vector<float>(), values.to(DType::BF16).to(DType::F32).to_vector<float>());
  EXPECT_NE(loaded.to_vector<float>(), values.to_vector<float>());
}

// Mixed precision on the CPU (--dtype bf16 where the CPU has AVX512_BF16): the GEMMs take bf16 operands,
// so the steps differ from f32's, yet the loss follows f32's within a percent step after step, with
// the master weights still f32.
TEST(Trainer, StepsWithBf16MatmulsOnTheCpuStayCloseToF32) {
  if (!kernels::cpu_has_bf16_matmul()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  LingForCausalLM f32_model(small_config(), 1), bf16_model(small_config(), 1);
  Trainer f32(f32_model, constant_lr(1e-2)), bf16(bf16_model, constant_lr(1e-2));
  Rng rng(4);
  for (int step = 0; step < 8; ++step) {
    const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16)};
    const double exact = f32.step(batch).loss;
    kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
    const double mixed = bf16.step(batch).loss;
    kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
    EXPECT_NEAR(mixed, exact, 1e-2 * exact) << "step " << step;
    EXPECT_NE(mixed, exact) << "step " << step << ": bf16 operands changed nothing";
  }
  EXPECT_EQ(bf16_model.parameters()[0].value->value().dtype(), DType::F32);
}

// The same on the CPU (autograd/saved.h): what the graph of a forward holds for its backward takes little
// more than half the memory it takes in f32 (0.62 on this model, whose f32 statistics and index tensors
// weigh more than a larger one's), and the gradients stay within a few percent of f32's.
TEST(Trainer, Bf16KeepsTheActivationsInAboutHalfTheMemoryOnTheCpu) {
  if (!kernels::cpu_has_bf16_matmul()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  LingForCausalLM model(small_config(), 1);
  test::expect_bf16_graph_within(model, Device::cpu(), 0.65);
}

}  // namespace
}  // namespace lt
