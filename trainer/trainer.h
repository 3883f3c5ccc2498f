// The Trainer: one training step, written once. Pre-training, the benchmarks and the tests all call
// Trainer::step; data parallel, EDiT, the spike guard, SFT and DPO plug into its seams (the hooks and
// the objective) instead of writing the loop again.
//
// A step, in order:
//   for each micro-batch: objective forward (the graph is built) -> backward (the gradient, scaled by
//     1 / micro-batches, accumulates in the flat gradient buffer); during the last one's backward, hook
//     gradient_ready as each parameter's gradient is complete (dist may start averaging it); after each
//     backward, hook after_micro_batch_backward (parameter sharding reduces what it left whole)
//   hook after_backward   the gradients of this process are complete (dist averages them here)
//   gradient norm         one reduction over the flat gradient buffer (hook complete_grad_sum_squares
//                         adds the other shards' parts when the optimiser is sharded)
//   hook before_update    losses and gradient norm are known (a spike guard may skip or retry)
//   clip + AdamW update   clipping rides along in the update kernel
//   hook after_update     a sharded optimiser's updated shard goes to the other shards
// and the statistics of the step are read back from the device once, at the end.
#pragma once
#include <cmath>
#include <functional>
#include <unordered_map>
#include <vector>

#include "data/batch_sampler.h"
#include "dist/parameter_shards.h"
#include "model/ling.h"
#include "optim/adamw.h"
#include "optim/flat_parameters.h"
#include "optim/schedule.h"
#include "trainer/train_state.h"

namespace lt {

struct TrainerSettings {
  AdamWSettings adam;
  double clip = 1.0;                // global gradient-norm clipping; 0 disables
  int64_t routing_warmup_steps = 0;  // stochastic routing warmup length W (0: none)
  LRSchedule schedule;              // of the current stage, at (stage_step, stage token fraction)
  double lr_scale = 1.0;            // on the schedule's rate (the spike guard's cuts)
  double stage_total_tokens = 1;    // the token budget of the current stage, for the wsd halving point
  uint64_t seed = 1;                // seeds the routing-warmup noise stream
  int rank = 0, world_size = 1;     // data parallel: this process's share of each step's batch
  // Sharded optimiser (ZeRO-2, dist/edit.h): this process updates shard `shard` of `shards` of the
  // flat buffers; the hooks complete the gradient norm and share the updated values.
  int shard = 0, shards = 1;
  // Parameter sharding (ZeRO-3, dist/parameter_shards.h): this process holds its part of every layer of the
  // flat buffers, and the optimiser updates that part.
  LayerShards layer_shards;
};

// What the hook before the update decides.
enum class UpdateDecision {
  Apply,  // clip and update (the normal case)
  Skip,   // drop this step's gradients, keep the parameters; the step and its data count as taken
  Retry,  // drop the gradients and do not count the step: the caller runs it again on the next batch
};

struct LayerRouting {
  int64_t layer = 0;                       // the decoder layer (model.layers.<layer>.mlp)
  std::vector<int64_t> tokens_per_expert;  // summed over the step's micro-batches
  double routing_entropy = 0;              // mean over micro-batches
  double max_logit = -INFINITY;            // the largest router logit of the step (the routing warmup's mixed ones)
};

struct StepStats {
  int64_t step = 0;  // optimiser steps taken after this one (1 after the first)
  double loss = 0, lm_loss = 0, aux_loss = 0, balance_loss = 0, z_loss = 0;  // means over micro-batches
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t tokens = 0, sequences = 0, micro_batches = 0;
  double forward_seconds = 0, backward_seconds = 0, optimizer_seconds = 0, seconds = 0;
  std::vector<LayerRouting> moe_layers;  // one per MoE layer
  std::vector<double> objective_stats;   // the objective's own sums (LossBreakdown::stats) over micro-batches
  UpdateDecision decision = UpdateDecision::Apply;
};

struct StepHooks {
  // Before the step, for objectives whose micro-batches carry loss units (SFT's labelled tokens, DPO's
  // pairs): this process's units of the step -> their mean over the ranks whose gradients are averaged, so
  // that the average weighs every unit of every rank alike, as one process with their micro-batches does.
  // Collective: every rank calls it whenever its micro-batches carry units, whatever their number.
  std::function<double(double units)> mean_loss_units;
  // During the step's last backward: parameter `index` (of FlatParameters::parameters()) holds its
  // complete gradient for the step (autograd's LeafGradientsReady), so its reduction may start.
  std::function<void(size_t index)> gradient_ready;
  // After each micro-batch's backward (parameter sharding reduces the gradients it left whole).
  std::function<void()> after_micro_batch_backward;
  std::function<void(FlatParameters&)> after_backward;
  // The squared gradient norm of this process's shard -> of all shards (sharded optimiser only).
  std::function<double(double)> complete_grad_sum_squares;
  std::function<UpdateDecision(const StepStats&)> before_update;
  // After an applied update: a sharded optimiser's shards are shared with the other shards here.
  std::function<void(FlatParameters&)> after_update;
};

// The loss of one micro-batch. Pre-training's is the next-token cross-entropy plus the MoE auxiliary
// losses; SFT masks targets with -100; DPO brings its own.
using Objective = std::function<LossBreakdown(LingForCausalLM&, const TokenBatch&, MoEContext&)>;
LossBreakdown language_model_objective(LingForCausalLM& model, const TokenBatch& batch, MoEContext& context);

class Trainer {
 public:
  // Lays the model's parameters out flat (they become views of one buffer) and builds the optimiser.
  Trainer(LingForCausalLM& model, TrainerSettings settings, Objective objective = language_model_objective);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimiser step over `micro_batches` (gradient accumulation: their mean loss, weighted by their
  // loss_units when they all have them: the mean over every labelled token or pair of the step, the
  // ranks' together through hooks().mean_loss_units).
  StepStats step(const std::vector<TokenBatch>& micro_batches);
  // The learning rate the next step will use.
  double next_lr() const;

  StepHooks& hooks() { return hooks_; }
  // The loss of the next steps (a recipe's stages may train different objectives).
  void set_objective(Objective objective) { objective_ = std::move(objective); }
  TrainerSettings& settings() { return settings_; }
  TrainState& state() { return state_; }
  const TrainState& state() const { return state_; }
  LingForCausalLM& model() { return model_; }
  FlatParameters& parameters() { return params_; }
  // Whatever writes the parameters' values outside step() (a checkpoint restored, another process's
  // values loaded) calls this: the bf16 copy of them that the last update wrote is stale then, and the
  // next step rounds the values anew.
  void values_changed() { values_bf16_current_ = false; }
  AdamW& optimizer() { return optimizer_; }

 private:
  LingForCausalLM& model_;
  TrainerSettings settings_;
  Objective objective_;
  FlatParameters params_;
  std::unordered_map<const VariableImpl*, size_t> parameter_index_;  // a leaf -> its FlatParameters index
  AdamW optimizer_;
  // The values rounded to bf16 for a step's matmuls (--dtype bf16 on a GPU), and whether it
  // holds their rounding now: written by the update in the same pass, so a step rounds them itself only
  // after values_changed(), an update that did not write all of them (a sharded optimiser) or one that a
  // hook followed (EDiT's exchange of the updated values).
  Tensor values_bf16_;
  bool values_bf16_current_ = false;
  StepHooks hooks_;
  TrainState state_;
};

// Parameter sharding on a trainer whose settings lay it out in parts (TrainerSettings::layer_shards): its
// model gathers each layer through these shards (dist/parameter_shards.h), and each micro-batch's backward
// ends with their reduction; the model forgets them when they go (the trainer may be gone already).
class TrainerShards {
 public:
  TrainerShards(Trainer& trainer, Communicator& group, Communicator* expert_copies = nullptr,
                int expert_group_size = 1);
  ~TrainerShards();
  TrainerShards(const TrainerShards&) = delete;
  TrainerShards& operator=(const TrainerShards&) = delete;
  ParameterShards& shards() { return shards_; }

 private:
  LingForCausalLM& model_;
  ParameterShards shards_;
};

// The metrics-log record of a step (io/metrics.h): losses, lr, gradient norm, tokens, speed and, per
// MoE layer, the expert load summary and routing entropy.
Json step_record(const StepStats& stats, int64_t tokens_seen);

}  // namespace lt
