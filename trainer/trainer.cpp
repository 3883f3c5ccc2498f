#include "trainer/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "autograd/ops.h"
#include "autograd/profile.h"
#include "moe/stats.h"
#include "tensor/bf16_shadow.h"
#include "tensor/derive_seed.h"
#include "tensor/kernels.h"

namespace lt {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The routing-warmup noise draws from its own stream of the run's seed.
constexpr uint64_t kRoutingNoiseStream = 1;
}  // namespace

LossBreakdown language_model_objective(LingForCausalLM& model, const TokenBatch& batch, MoEContext& context) {
  return model.loss(batch.inputs, batch.targets, context, batch.doc_start);
}

Trainer::Trainer(LingForCausalLM& model, TrainerSettings settings, Objective objective)
    : model_(model),
      settings_(std::move(settings)),
      objective_(std::move(objective)),
      params_(model.parameters(), settings_.shards, settings_.layer_shards),
      optimizer_(params_, settings_.adam, settings_.shard, settings_.shards) {
  for (size_t i = 0; i < params_.parameters().size(); ++i)
    parameter_index_[params_.parameters()[i].parameter.value->impl()] = i;
}

double Trainer::next_lr() const {
  return settings_.lr_scale *
         settings_.schedule.at(state_.stage_step,
                               static_cast<double>(state_.stage_tokens) / std::max(settings_.stage_total_tokens, 1.0));
}

namespace {

// Each micro-batch's share of the step's loss: equal, or by its loss units when every one has them
// (then returns true): its units over the step's, or over the mean of the averaging ranks' steps.
bool micro_batch_weights(const std::vector<TokenBatch>& micro_batches, const StepHooks& hooks,
                         std::vector<double>& weights) {
  bool with_units = true;
  int64_t units = 0;
  for (const TokenBatch& batch : micro_batches) {
    with_units = with_units && batch.loss_units >= 0;
    units += std::max<int64_t>(batch.loss_units, 0);
  }
  weights.assign(micro_batches.size(), 1.0 / static_cast<double>(micro_batches.size()));
  if (!with_units) return false;
  const double per_step = hooks.mean_loss_units ? hooks.mean_loss_units(static_cast<double>(units))
                                                : static_cast<double>(units);
  if (per_step <= 0) return false;
  for (size_t i = 0; i < micro_batches.size(); ++i)
    weights[i] = static_cast<double>(micro_batches[i].loss_units) / per_step;
  return true;
}

// The ids of a micro-batch made on the host, checked there before they are copied to the model's
// device: one clear error for bad data, and the kernels on a GPU then trust them (no check that waits
// for the device). False when they are on a device already: they are checked there, as they are used.
bool check_batch_ids_on_host(const TokenBatch& batch, int64_t vocab) {
  const bool on_host = batch.inputs.is_cpu() && batch.targets.is_cpu() &&
                       (!batch.response.defined() || batch.response.is_cpu());
  if (!on_host) return false;
  const kernels::OutOfRange input = kernels::first_out_of_range_on_host(batch.inputs, {vocab});
  LT_CHECK(input.position < 0, "batch: token id ", input.value, " at position ", input.position,
           " is outside the vocabulary [0, ", vocab, ")");
  const kernels::OutOfRange target = kernels::first_out_of_range_on_host(batch.targets, {vocab, true, -100});
  LT_CHECK(target.position < 0, "batch: target id ", target.value, " at position ", target.position,
           " is outside the vocabulary [0, ", vocab, ") and not -100");
  if (batch.response.defined()) {
    const int64_t responses = batch.reference_logp.defined() ? batch.reference_logp.numel() : 0;
    const kernels::OutOfRange response = kernels::first_out_of_range_on_host(batch.response, {responses, true, -1});
    LT_CHECK(response.position < 0, "batch: response id ", response.value, " at position ", response.position,
             " is outside [-1, ", responses, ")");
  }
  return true;
}

// What a step reads back from the device, gathered so that it is read in one copy (kernels::copy_to_host)
// at the step's end: per micro-batch its losses, its objective's figures and each MoE layer's routing
// figures, then the gradients' sum of squares.
class StepReadback {
 public:
  // Adds tensors to read; returns the index of the first.
  size_t add(std::initializer_list<Tensor> tensors) {
    const size_t first = device_.size();
    for (const Tensor& t : tensors) device_.push_back(t);
    return first;
  }
  void read() { kernels::copy_to_host(device_, host_); }
  const Tensor& host(size_t i) const { return host_[i]; }
  double value(size_t i) const { return host_[i].item(); }

 private:
  std::vector<Tensor> device_, host_;
};

struct MicroBatchFigures {
  size_t losses = 0;    // total, lm, aux, balance, z
  std::optional<size_t> stats;  // the objective's figures, when it has them
  size_t routing = 0;   // per MoE layer: tokens per expert, entropy, max logit
  size_t moe_layers = 0;
};

// One micro-batch's routing figures into the step's, per MoE layer: the loads added, the entropies
// averaged over the m micro-batches, the largest router logit kept.
void add_routing(const StepReadback& readback, const MicroBatchFigures& figures, const LingConfig& config, double m,
                 std::vector<LayerRouting>& step_layers) {
  if (step_layers.empty()) {
    step_layers.resize(figures.moe_layers);
    const std::vector<int64_t> indices = config.moe_layer_indices();
    for (size_t i = 0; i < figures.moe_layers; ++i) step_layers[i].layer = indices[i];
  }
  for (size_t i = 0; i < figures.moe_layers; ++i) {
    LayerRouting& out = step_layers[i];
    const size_t at = figures.routing + 3 * i;
    // Counts are exact integers in the logits' dtype (moe/router.h).
    const std::vector<int64_t> load = readback.host(at).to(DType::I64).to_vector<int64_t>();
    if (out.tokens_per_expert.empty()) out.tokens_per_expert.assign(load.size(), 0);
    for (size_t e = 0; e < load.size(); ++e) out.tokens_per_expert[e] += load[e];
    out.routing_entropy += readback.value(at + 1) / m;
    out.max_logit = std::max(out.max_logit, readback.value(at + 2));
  }
}

}  // namespace

StepStats Trainer::step(const std::vector<TokenBatch>& micro_batches) {
  LT_CHECK(!micro_batches.empty(), "Trainer::step needs at least one micro-batch");
  const Clock::time_point start = Clock::now();
  StepStats stats;
  stats.lr = next_lr();
  stats.micro_batches = static_cast<int64_t>(micro_batches.size());
  const double m = static_cast<double>(micro_batches.size());
  std::vector<double> weights;
  const bool weighted = micro_batch_weights(micro_batches, hooks_, weights);

  // The losses and figures stay on the device until the step is done: no host round trip between
  // micro-batches, and one at the end.
  StepReadback readback;
  std::vector<MicroBatchFigures> figures;
  // Mixed precision on a GPU: the weights' bf16 rounding for every matmul of the step's forward and
  // backward (tensor/bf16_shadow.h), written by the last update in its pass (values_bf16_current_), else
  // made here; the update comes after the scope. (The CPU's bf16 GEMM converts as it packs: reading such a
  // copy made its products no faster there, and writing it cost the update more than they saved.)
  std::optional<Bf16Shadow> bf16_weights;
  // (Under parameter sharding each layer is rounded as it is gathered: dist/parameter_shards.h.)
  const bool bf16_copy = kernels::matmul_precision() == kernels::MatmulPrecision::BF16Inputs &&
                         !params_.values().is_cpu() && !params_.sharded_by_layer();
  if (bf16_copy) {
    if (!values_bf16_.defined())
      values_bf16_ = Tensor::empty(params_.values().shape(), DType::BF16, params_.values().device());
    if (!values_bf16_current_) kernels::convert(params_.values(), values_bf16_);
    bf16_weights.emplace(params_.values(), values_bf16_);
  }
  // Only a completed update below makes the copy current again (a step that throws leaves it stale).
  values_bf16_current_ = false;
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const TokenBatch& batch = micro_batches[i];
    const Clock::time_point t0 = Clock::now();
    MoEContext context;
    context.step = state_.step;
    context.training = true;
    context.warmup_steps = settings_.routing_warmup_steps;
    // Micro-batch i of rank r holds rows [(i W + r) B, (i W + r + 1) B) of the step's global batch (the
    // samplers' layout: data/batch_sampler.h), which fixes each token's warmup noise.
    context.noise_seed = derive_seed(settings_.seed, kRoutingNoiseStream);
    context.first_sequence = (static_cast<int64_t>(i) * settings_.world_size + settings_.rank) * batch.inputs.dim(0);
    Clock::time_point t1;
    {
      std::optional<kernels::TrustedDeviceIndices> trusted;
      if (check_batch_ids_on_host(batch, model_.config().vocab_size)) trusted.emplace();
      const LossBreakdown loss = objective_(model_, batch, context);
      t1 = Clock::now();
      std::optional<LeafGradientsReady> listening;
      if (hooks_.gradient_ready && i + 1 == micro_batches.size())
        listening.emplace([this](const VariableImpl& leaf) {
          const auto found = parameter_index_.find(&leaf);
          if (found != parameter_index_.end()) hooks_.gradient_ready(found->second);
        });
      scale(loss.total, weights[i]).backward();
      if (hooks_.after_micro_batch_backward) hooks_.after_micro_batch_backward();
      MicroBatchFigures f;
      f.losses = readback.add({loss.total.value(), loss.lm.value(), loss.aux, loss.balance, loss.z});
      if (loss.stats.defined()) f.stats = readback.add({loss.stats});
      f.routing = readback.add({});
      f.moe_layers = context.stats.size();
      for (const ExpertStats& layer : context.stats)
        readback.add({layer.tokens_per_expert, layer.routing_entropy, layer.max_logit});
      figures.push_back(f);
    }  // the graph's last references go here, inside the backward phase
    stats.forward_seconds += seconds_between(t0, t1);
    stats.backward_seconds += seconds_between(t1, Clock::now());
    stats.tokens += batch.inputs.numel();
    stats.sequences += batch.inputs.dim(0);
  }

  bf16_weights.reset();
  const Clock::time_point t2 = Clock::now();
  if (hooks_.after_backward) hooks_.after_backward(params_);
  // The routing warmup's statistics take the step's observations now that the hook has averaged them
  // across ranks: every micro-batch of the step routed with the same statistics (moe/router.h).
  if (settings_.routing_warmup_steps > 0 && state_.step < settings_.routing_warmup_steps)
    model_.fold_routing_warmup();
  {
    LT_PROFILE_PHASE_SCOPE("grad_norm", profile::Phase::Optimizer);
    const size_t grad_parts = readback.add({optimizer_.grad_sum_squares_parts()});
    readback.read();
    double sum_squares = AdamW::sum_of_parts(readback.host(grad_parts));
    if (hooks_.complete_grad_sum_squares) sum_squares = hooks_.complete_grad_sum_squares(sum_squares);
    stats.grad_norm = std::sqrt(sum_squares);
    optimizer_.clip_to(stats.grad_norm, settings_.clip);
  }
  // The step's statistics, summed in micro-batch order as one running sum would be.
  for (size_t i = 0; i < figures.size(); ++i) {
    const double w = weighted ? weights[i] : 1.0;
    const size_t at = figures[i].losses;
    stats.loss += w * readback.value(at);
    stats.lm_loss += w * readback.value(at + 1);
    stats.aux_loss += w * readback.value(at + 2);
    stats.balance_loss += w * readback.value(at + 3);
    stats.z_loss += w * readback.value(at + 4);
    if (figures[i].stats) {
      const std::vector<double> sums = readback.host(*figures[i].stats).to_vector<double>();
      if (stats.objective_stats.empty()) stats.objective_stats.assign(sums.size(), 0.0);
      for (size_t k = 0; k < sums.size(); ++k) stats.objective_stats[k] += sums[k];
    }
  }
  if (!weighted) {
    stats.loss /= m;
    stats.lm_loss /= m;
    stats.aux_loss /= m;
    stats.balance_loss /= m;
    stats.z_loss /= m;
  }
  for (const MicroBatchFigures& f : figures) add_routing(readback, f, model_.config(), m, stats.moe_layers);

  stats.step = state_.step + 1;
  stats.decision = hooks_.before_update ? hooks_.before_update(stats) : UpdateDecision::Apply;
  // The update writes the copy only where it leaves the copy current: it updates every value and no hook
  // changes them after it (a sharded optimiser's or EDiT's step rounds the values anew).
  const bool updated_all = optimizer_.owned().size() == params_.numel() && !hooks_.after_update;
  if (stats.decision == UpdateDecision::Apply) {
    LT_PROFILE_PHASE_SCOPE("adamw", profile::Phase::Optimizer);
    optimizer_.step(stats.lr, bf16_copy && updated_all ? values_bf16_ : Tensor());
    if (hooks_.after_update) hooks_.after_update(params_);
  }
  values_bf16_current_ = bf16_copy && (stats.decision != UpdateDecision::Apply || updated_all);
  {
    LT_PROFILE_PHASE_SCOPE("zero_grad", profile::Phase::Optimizer);
    params_.zero_grad();
  }
  // Every rank steps the same batch size, so the step's tokens over all ranks are world_size times these.
  stats.tokens *= settings_.world_size;
  stats.sequences *= settings_.world_size;
  state_.tokens_seen += stats.tokens;
  state_.stage_tokens += stats.tokens;
  if (stats.decision != UpdateDecision::Retry) {
    ++state_.step;
    ++state_.stage_step;
  } else {
    stats.step = state_.step;
  }
  const Clock::time_point end = Clock::now();
  stats.optimizer_seconds = seconds_between(t2, end);
  stats.seconds = seconds_between(start, end);
  return stats;
}

TrainerShards::TrainerShards(Trainer& trainer, Communicator& group, Communicator* expert_copies,
                             int expert_group_size)
    : model_(trainer.model()), shards_(group, trainer.parameters(), expert_copies, expert_group_size) {
  model_.set_parameter_gathering(&shards_);
  trainer.hooks().after_micro_batch_backward = [this] { shards_.finish_backward(); };
}

TrainerShards::~TrainerShards() { model_.set_parameter_gathering(nullptr); }

Json step_record(const StepStats& s, int64_t tokens_seen) {
  Json record = {{"step", s.step},
                 {"loss", s.loss},
                 {"lm_loss", s.lm_loss},
                 {"aux_loss", s.aux_loss},
                 {"balance_loss", s.balance_loss},
                 {"z_loss", s.z_loss},
                 {"grad_norm", s.grad_norm},
                 {"lr", s.lr},
                 {"tokens", tokens_seen},
                 {"batch_seqs", s.sequences},
                 {"tokens_per_s", static_cast<double>(s.tokens) / s.seconds},
                 {"step_seconds", s.seconds}};
  if (s.decision != UpdateDecision::Apply) record["update"] = s.decision == UpdateDecision::Skip ? "skipped" : "retry";
  if (s.moe_layers.empty()) return record;
  Json layers = Json::array();
  for (size_t i = 0; i < s.moe_layers.size(); ++i) {
    const LoadSummary load = summarize_load(s.moe_layers[i].tokens_per_expert);
    layers.push_back({{"layer", s.moe_layers[i].layer},
                      {"max_over_mean", load.max_over_mean},
                      {"min_load", load.min_load},
                      {"dead_experts", load.dead_experts},
                      {"load_cv", load.load_cv},
                      {"routing_entropy", s.moe_layers[i].routing_entropy},
                      {"max_logit", s.moe_layers[i].max_logit},
                      {"tokens_per_expert", s.moe_layers[i].tokens_per_expert}});
  }
  record["moe_layers"] = layers;
  return record;
}

}  // namespace lt
