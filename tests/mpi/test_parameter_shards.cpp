// Parameter sharding (dist/parameter_shards.h) across real MPI ranks: the tiny model trained for a few steps,
// every rank holding its part of each layer, alone and with expert parallelism, against one process that
// takes every rank's batch as a micro-batch of each step (--accum N): the same losses, gradient norms,
// weights and moments within float rounding (the sharded run sums each micro-batch's mean over the ranks,
// the single one the micro-batches first), and a rank holds its part of the values, gradients and moments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "dist/data_parallel.h"
#include "dist/expert_exchange.h"
#include "dist/parameter_shards.h"
#include "model/config.h"
#include "model/hf_names.h"
#include "model/ling.h"
#include "tensor/random.h"
#include "tests/mpi/mpi_world.h"
#include "trainer/trainer.h"

namespace lt {
namespace {

using mpi_test::world;

TokenBatch batch_of(const LingConfig& config, int step, int rank, int micro_batch, int64_t B, int64_t T) {
  Rng rng(1000 + static_cast<uint64_t>(100 * step + 10 * rank + micro_batch));
  std::vector<int32_t> inputs, targets;
  for (int64_t i = 0; i < B * T; ++i) {
    inputs.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))));
    targets.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size))));
  }
  return {Tensor::from_vector<int32_t>({B, T}, inputs), Tensor::from_vector<int32_t>({B, T}, targets)};
}

double relative_difference(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to(DType::F64).to_vector<double>(), y = b.to(DType::F64).to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (x[i] - y[i]) * (x[i] - y[i]);
    norm += y[i] * y[i];
  }
  return diff == 0 ? 0 : std::sqrt(diff / norm);
}

// G: the expert-parallel degree (1: none). Under it rank r holds the experts of shard r mod G, split over the
// ranks holding the same experts; everything else is split over all ranks.
void expect_training_like_one_process(int G) {
  const int N = world->size(), r = world->rank();
  const LingConfig config = preset_config("tiny");
  const int64_t B = 2, T = 16, steps = 4, accum = 2;
  TrainerSettings settings;
  settings.routing_warmup_steps = 2;
  settings.schedule.kind = "constant";
  settings.schedule.peak = 1e-3;

  LingForCausalLM whole_model(config, 7);
  Trainer whole(whole_model, settings);

  const std::unique_ptr<Communicator> group = world->split(r / G, r), copies = world->split(r % G, r);
  LingForCausalLM sharded_model(config, 7, ExpertSlice{r % G, G});
  ExpertCommunicatorGroup exchange(*group);
  if (G > 1) sharded_model.set_expert_group(&exchange);
  TrainerSettings sharded_settings = settings;
  sharded_settings.rank = r;
  sharded_settings.world_size = N;
  sharded_settings.layer_shards = {r, N};
  if (G > 1) {
    sharded_settings.layer_shards.is_experts = is_stacked_experts;
    sharded_settings.layer_shards.expert_rank = copies->rank();
    sharded_settings.layer_shards.expert_ranks = copies->size();
  }
  Trainer sharded(sharded_model, sharded_settings);
  TrainerShards attached(sharded, *world, G > 1 ? copies.get() : nullptr, G);
  ParameterShards& shards = attached.shards();
  sharded.hooks().complete_grad_sum_squares = [&](double own) { return shards.grad_sum_squares(own); };
  // The routing warmup's observations of the step, each rank's of its own rows, averaged as data parallel does.
  DataParallel data_parallel(*world);
  sharded.hooks().after_backward = [&](FlatParameters&) { data_parallel.average_buffers(sharded_model); };

  // A rank holds its part: of the replicated parameters 1/N, of its G-th of the experts 1/(N / G), so 1/N of
  // the model, plus at most the alignment of each unit's part.
  const FlatParameters& held = sharded.parameters();
  const int64_t expected = whole.parameters().numel() / N;
  EXPECT_LE(held.numel(), expected + 16 * static_cast<int64_t>(held.units().size())) << "expected " << expected;
  EXPECT_EQ(sharded.optimizer().owned().size(), held.numel());

  for (int step = 0; step < steps; ++step) {
    // The single process's micro-batches in the samplers' order: micro-batch i of rank q is its (i N + q)-th.
    std::vector<TokenBatch> all, mine;
    for (int i = 0; i < accum; ++i)
      for (int q = 0; q < N; ++q) all.push_back(batch_of(config, step, q, i, B, T));
    for (int i = 0; i < accum; ++i) mine.push_back(batch_of(config, step, r, i, B, T));
    const StepStats one = whole.step(all);
    StepStats part = sharded.step(mine);
    Tensor loss = Tensor::full({1}, part.loss, DType::F64);
    world->all_reduce(loss, ReduceOp::Mean);
    EXPECT_NEAR(loss.item(), one.loss, 1e-6 * std::abs(one.loss)) << "step " << step;
    EXPECT_NEAR(part.grad_norm, one.grad_norm, 1e-5 * one.grad_norm) << "step " << step;
  }

  // The weights and second moments rank 0 gathers (its experts' shard: the first E / G experts), against the
  // single process's.
  const Tensor weights = shards.whole(held.values());
  const Tensor moments = shards.whole(sharded.optimizer().shard_state()[1].second);
  if (r != 0) return;
  const FlatParameters& one = whole.parameters();
  const Tensor one_moments = whole.optimizer().shard_state()[1].second;
  double largest = 0;
  for (size_t i = 0; i < one.parameters().size(); ++i) {
    const std::string& name = one.parameters()[i].parameter.name;
    Tensor expected_weights = one.view(one.values(), i), expected_moments = one.view(one_moments, i);
    if (is_stacked_experts(name)) {
      const int64_t held_experts = config.num_experts / G;
      expected_weights = expected_weights.narrow(0, held_experts);
      expected_moments = expected_moments.narrow(0, held_experts);
    }
    const double weight_difference = relative_difference(held.view(weights, i), expected_weights);
    largest = std::max(largest, weight_difference);
    EXPECT_LT(weight_difference, 1e-5) << name;
    EXPECT_LT(relative_difference(held.view(moments, i), expected_moments), 1e-4) << name;
  }
  std::printf("%d ranks, expert parallel %d: the largest relative weight difference after %lld steps is %.2e\n", N,
              G, static_cast<long long>(steps), largest);
}

TEST(ParameterShards, TrainWhatOneProcessTrainsWithAMicroBatchPerRank) { expect_training_like_one_process(1); }

TEST(ParameterShards, WithExpertParallelismTrainWhatOneProcessTrains) { expect_training_like_one_process(2); }

}  // namespace
}  // namespace lt
