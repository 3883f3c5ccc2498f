// Training on a GPU against training on the CPU. In lingtrain_tests it runs where a GPU exists (and
// skips elsewhere); lingtrain_emulated_gpu_tests runs it on every machine against the emulated GPU
// (tests/cuda/emulated_gpu.cpp), where every op of the step goes through its CUDA kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "dist/communicator.h"
#include "model/ling.h"
#include "moe/expert_parallel.h"
#include "tensor/allocator.h"
#include "tensor/device.h"
#include "tensor/kernels.h"
#include "tests/io/temp_dir.h"
#include "tests/model/small_config.h"
#include "tests/trainer/trainer_test_util.h"
#include "trainer/checkpoint.h"
#include "trainer/generate.h"
#include "trainer/trainer.h"

namespace lt {
namespace {

using test::constant_lr;
using test::random_batch;
using test::small_config;
using test::values_of;

// A GPU step's loss and gradient norm against the CPU's, to the rounding of another summation order.
void expect_step_near(const StepStats& actual, const StepStats& expected, int step) {
  EXPECT_NEAR(actual.loss, expected.loss, 1e-4 * std::abs(expected.loss)) << "step " << step;
  EXPECT_NEAR(actual.grad_norm, expected.grad_norm, 1e-3 * expected.grad_norm) << "step " << step;
}

// AdamW divides each gradient by its own running magnitude, so a weight moves by about lr a step however
// small its gradient, and where the gradient is small (a router's during the warmup, reached through
// alpha) two summation orders can part it by a percent of lr over a few steps: 2e-4 is 2% of one step's
// move at lr 1e-2.
void expect_weights_near(Trainer& actual, Trainer& expected) {
  const std::vector<float> expected_values = values_of(expected), actual_values = values_of(actual);
  ASSERT_EQ(actual_values.size(), expected_values.size());
  for (size_t i = 0; i < expected_values.size(); ++i)
    ASSERT_NEAR(actual_values[i], expected_values[i], 2e-4) << "weight " << i;
}

// The model on the GPU (Module::to before the Trainer lays it out flat), fed the same host batches:
// the same losses, gradient norms and updated weights as on the CPU, to the rounding of another
// summation order, over steps with the routing warmup's noise and without.
TEST(Trainer, StepsOnTheGpuMatchTheStepsOnTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM cpu_model(small_config(), 1), gpu_model(small_config(), 1);
  gpu_model.to(Device::cuda(0));
  ASSERT_EQ(gpu_model.device(), Device::cuda(0));
  TrainerSettings settings = constant_lr(1e-2);
  settings.routing_warmup_steps = 2;
  Trainer on_cpu(cpu_model, settings), on_gpu(gpu_model, settings);
  Rng rng(3);
  for (int step = 0; step < 4; ++step) {
    const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16), random_batch(rng, 2, 16)};
    const StepStats expected = on_cpu.step(batch), actual = on_gpu.step(batch);
    EXPECT_NEAR(actual.loss, expected.loss, 1e-4 * std::abs(expected.loss)) << "step " << step;
    EXPECT_NEAR(actual.aux_loss, expected.aux_loss, 1e-4 * std::abs(expected.aux_loss) + 1e-9) << "step " << step;
    EXPECT_NEAR(actual.grad_norm, expected.grad_norm, 1e-3 * expected.grad_norm) << "step " << step;
    ASSERT_EQ(actual.moe_layers.size(), expected.moe_layers.size());
    for (size_t l = 0; l < expected.moe_layers.size(); ++l)
      EXPECT_EQ(actual.moe_layers[l].tokens_per_expert, expected.moe_layers[l].tokens_per_expert) << "step " << step;
  }
  expect_weights_near(on_gpu, on_cpu);
}

// The routed experts through the expert-parallel path (a group of one rank: the exchange is the identity,
// the rest of expert_parallel_experts runs as under --expert-parallel): on the GPU the steps match the
// CPU's as the plain path's do.
TEST(Trainer, ExpertParallelStepsOnTheGpuMatchTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM cpu_model(small_config(), 1), gpu_model(small_config(), 1);
  LocalExpertGroup group;
  cpu_model.set_expert_group(&group);
  gpu_model.set_expert_group(&group);
  gpu_model.to(Device::cuda(0));
  Trainer on_cpu(cpu_model, constant_lr(1e-2)), on_gpu(gpu_model, constant_lr(1e-2));
  Rng rng(4);
  for (int step = 0; step < 3; ++step) {
    const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16)};
    const StepStats expected = on_cpu.step(batch), actual = on_gpu.step(batch);
    expect_step_near(actual, expected, step);
  }
  expect_weights_near(on_gpu, on_cpu);
}

// Parameter sharding over one process (--shard-params, dist/parameter_shards.h): every layer's weights
// released between their uses and gathered back into memory taken afresh, its gradients reduced as the
// backward goes: on the GPU the steps match the CPU's unsharded ones as the plain path's do, and between
// steps no layer is held whole.
TEST(Trainer, ShardedParameterStepsOnTheGpuMatchTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM cpu_model(small_config(), 1), gpu_model(small_config(), 1);
  gpu_model.to(Device::cuda(0));
  TrainerSettings settings = constant_lr(1e-2);
  settings.routing_warmup_steps = 2;
  TrainerSettings sharded = settings;
  sharded.layer_shards = {0, 1};
  Trainer on_cpu(cpu_model, settings), on_gpu(gpu_model, sharded);
  const std::unique_ptr<Communicator> one_process = make_single_process_communicator();
  const TrainerShards shards(on_gpu, *one_process);
  Rng rng(3);
  for (int step = 0; step < 3; ++step) {
    const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16), random_batch(rng, 2, 16)};
    const StepStats expected = on_cpu.step(batch), actual = on_gpu.step(batch);
    expect_step_near(actual, expected, step);
    for (size_t u = 0; u < on_gpu.parameters().units().size(); ++u) {
      EXPECT_TRUE(on_gpu.parameters().unit_values(u).storage().released()) << "unit " << u << ", step " << step;
      EXPECT_TRUE(on_gpu.parameters().unit_grads(u).storage().released()) << "unit " << u << ", step " << step;
    }
  }
  expect_weights_near(on_gpu, on_cpu);
}

// Parameter sharding under mixed precision: each gathered layer's bf16 rounding, made as it is gathered,
// stands for the step's rounding of the whole flat buffer, so the sharded steps match the unsharded ones
// in bf16 on the GPU to the order of their sums.
TEST(Trainer, ShardedParameterStepsWithBf16MatmulsOnTheGpuMatchTheUnsharded) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM whole_model(small_config(), 1), sharded_model(small_config(), 1);
  whole_model.to(Device::cuda(0));
  sharded_model.to(Device::cuda(0));
  TrainerSettings settings = constant_lr(1e-2), sharded = settings;
  sharded.layer_shards = {0, 1};
  Trainer whole(whole_model, settings), parts(sharded_model, sharded);
  const std::unique_ptr<Communicator> one_process = make_single_process_communicator();
  const TrainerShards shards(parts, *one_process);
  kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
  Rng rng(5);
  for (int step = 0; step < 3; ++step) {
    const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16)};
    const StepStats expected = whole.step(batch), actual = parts.step(batch);
    EXPECT_NEAR(actual.loss, expected.loss, 1e-5 * std::abs(expected.loss)) << "step " << step;
    EXPECT_NEAR(actual.grad_norm, expected.grad_norm, 1e-4 * expected.grad_norm) << "step " << step;
  }
  kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
}

// Mixed precision (--dtype bf16): the GPU's matmuls take bf16 operands. The steps differ from the f32
// ones (the mode is on), yet stay within a percent of the CPU's f32 losses.
TEST(Trainer, StepsWithBf16MatmulsOnTheGpuStayCloseToF32) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM cpu_model(small_config(), 1), f32_model(small_config(), 1), bf16_model(small_config(), 1);
  f32_model.to(Device::cuda(0));
  bf16_model.to(Device::cuda(0));
  Trainer on_cpu(cpu_model, constant_lr(1e-2)), f32(f32_model, constant_lr(1e-2)), bf16(bf16_model, constant_lr(1e-2));
  Rng rng(4);
  for (int step = 0; step < 3; ++step) {
    const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16)};
    const double expected = on_cpu.step(batch).loss, exact = f32.step(batch).loss;
    kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
    const double mixed = bf16.step(batch).loss;
    kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
    EXPECT_NEAR(exact, expected, 1e-4 * expected) << "step " << step;
    EXPECT_NEAR(mixed, expected, 1e-2 * expected) << "step " << step;
    EXPECT_NE(mixed, exact) << "step " << step << ": bf16 operands changed nothing";
  }
}

// Mixed precision on the GPU: the weights' bf16 copy that each update writes in its pass stands for the
// rounding a step would make itself, bit for bit; and after values_changed() (values written outside a
// step: a checkpoint restored) a step rounds the new values, its loss that of a trainer started from them.
TEST(Trainer, TheUpdatesBf16CopyOfTheWeightsIsTheGpuStepsOwnRounding) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM fused_model(small_config(), 1), rounding_model(small_config(), 1), other_model(small_config(), 2);
  for (LingForCausalLM* m : {&fused_model, &rounding_model, &other_model}) m->to(Device::cuda(0));
  Trainer fused(fused_model, constant_lr(1e-2)), rounding(rounding_model, constant_lr(1e-2));
  Trainer other(other_model, constant_lr(1e-2));
  kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
  Rng rng(6);
  for (int step = 0; step < 3; ++step) {
    const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16)};
    rounding.values_changed();
    EXPECT_EQ(fused.step(batch).loss, rounding.step(batch).loss) << "step " << step;
  }
  EXPECT_EQ(values_of(fused), values_of(rounding));
  const std::vector<TokenBatch> batch = {random_batch(rng, 2, 16)};
  fused.parameters().values().copy_from(other.parameters().values());
  fused.values_changed();
  other.state().step = fused.state().step;  // the same step: the same routing noise
  EXPECT_EQ(fused.step(batch).loss, other.step(batch).loss);
  kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
}

// Mixed precision keeps the activations in bf16 (autograd/saved.h): what the graph of a forward holds
// for its backward takes little more than half the memory it takes in f32 (the f32 statistics and the
// routing's index tensors are the rest), and the backward it feeds gives gradients within a few percent
// of f32's.
TEST(Trainer, Bf16KeepsTheActivationsInAboutHalfTheMemory) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  const Device gpu = Device::cuda(0);
  LingForCausalLM model(small_config(), 1);
  model.to(gpu);
  test::expect_bf16_graph_within(model, gpu, 0.6);
}

// Checkpoints move freely between devices: weights and optimiser state written by a GPU run load into
// a CPU run bit for bit, and back.
// Under mixed precision a forward that needs no gradient though grad mode is on (every parameter frozen,
// as a DPO reference model is) builds no graph: the copies its kernels write for the nodes that would keep
// them are dropped, and its loss is the loss of a forward without grad mode.
TEST(Trainer, Bf16OnAFrozenModelGivesTheLossOfAForwardWithoutGradients) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  const Device gpu = Device::cuda(0);
  LingForCausalLM model(small_config(), 1);
  model.to(gpu);
  for (const auto& p : model.parameters()) p.value->set_requires_grad(false);
  Rng rng(7);
  const TokenBatch batch = random_batch(rng, 2, 32);
  const Tensor ids = batch.inputs.to(gpu), targets = batch.targets.to(gpu);
  auto loss_of = [&](bool grad_mode) {
    std::optional<NoGradGuard> no_grad;
    if (!grad_mode) no_grad.emplace();
    MoEContext context;
    const LossBreakdown loss = model.loss(ids, targets, context);
    EXPECT_FALSE(loss.total.requires_grad());
    return loss.total.value().to(Device::cpu()).to_vector<float>()[0];
  };
  kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
  const float with_grad_mode = loss_of(true), without = loss_of(false);
  kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
  EXPECT_EQ(with_grad_mode, without);
}

TEST(Trainer, CheckpointsMoveBetweenTheGpuAndTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM gpu_model(small_config(), 7), cpu_model(small_config(), 8), back_on_gpu(small_config(), 9);
  gpu_model.to(Device::cuda(0));
  back_on_gpu.to(Device::cuda(0));
  Trainer on_gpu(gpu_model, constant_lr(1e-2)), on_cpu(cpu_model, constant_lr(1e-2));
  Trainer again_on_gpu(back_on_gpu, constant_lr(1e-2));
  Rng rng(8);
  on_gpu.step({random_batch(rng, 2, 8)});
  test::TempDir dir;
  save_checkpoint(dir.root() + "/from_gpu", gpu_model, &on_gpu.optimizer(), Json::object());
  load_checkpoint_weights(dir.root() + "/from_gpu", cpu_model);
  load_checkpoint_optimizer(dir.root() + "/from_gpu", cpu_model, on_cpu.optimizer());
  EXPECT_EQ(values_of(on_cpu), values_of(on_gpu));
  const auto gpu_state = on_gpu.optimizer().state(), cpu_state = on_cpu.optimizer().state();
  ASSERT_EQ(cpu_state.size(), gpu_state.size());
  for (size_t i = 0; i < gpu_state.size(); ++i)
    EXPECT_EQ(cpu_state[i].second.to_vector<float>(), gpu_state[i].second.to_vector<float>()) << gpu_state[i].first;
  save_checkpoint(dir.root() + "/from_cpu", cpu_model, &on_cpu.optimizer(), Json::object());
  load_checkpoint_weights(dir.root() + "/from_cpu", back_on_gpu);
  EXPECT_EQ(values_of(again_on_gpu), values_of(on_gpu));
  EXPECT_EQ(back_on_gpu.device(), Device::cuda(0));
}

// Greedy generation with the KV cache on the GPU picks the CPU's tokens: one prompt alone, and ragged
// prompts decoded together (decoding attention with a length per row, rows leaving the batch at the stop
// id).
TEST(Trainer, GreedyGenerationOnTheGpuMatchesTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  LingForCausalLM on_cpu(small_config(), 5), on_gpu(small_config(), 5);
  on_gpu.to(Device::cuda(0));
  SamplingSettings greedy;
  greedy.max_new_tokens = 12;
  greedy.temperature = 0;
  const std::vector<std::vector<uint32_t>> prompts = {{3, 17, 101, 42, 7}, {9}, {200, 1, 5}, {64, 65, 66, 67, 68}};
  EXPECT_EQ(generate(on_gpu, prompts[0], greedy, 250), generate(on_cpu, prompts[0], greedy, 250));
  greedy.stop_at = generate(on_cpu, prompts[2], greedy, 250).at(3);
  const std::vector<std::vector<uint32_t>> on_cpu_rows = generate_batch(on_cpu, prompts, greedy, 250);
  EXPECT_EQ(generate_batch(on_gpu, prompts, greedy, 250), on_cpu_rows);
  EXPECT_LE(on_cpu_rows[2].size(), 4u);
}

}  // namespace
}  // namespace lt
