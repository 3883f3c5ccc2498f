#include "trainer/edit_strategy.h"

#include "model/hf_names.h"

namespace lt {

EditStrategy::EditStrategy(RunSetup& setup)
    : LockstepStrategy(setup.world()),
      setup_(setup),
      mesh_(EditMesh::build(setup.world(), setup.edit().shard_group, setup.expert_parallel())) {}

void EditStrategy::configure(TrainerSettings& settings) {
  if (setup_.shard_params() && mesh_->expert_group) {
    // An expert-parallel replica: each rank's experts its own, everything else in parts over the replica.
    settings.layer_shards = {mesh_->expert_group->rank(), mesh_->expert_group->size(), is_stacked_experts, 0, 1};
    return;
  }
  if (setup_.shard_params()) {
    settings.layer_shards = {mesh_->shard(), mesh_->shards()};
    return;
  }
  settings.shard = mesh_->shard();
  settings.shards = mesh_->shards();
}

void EditStrategy::attach(Trainer& trainer) {
  trainer_ = &trainer;
  StepHooks& hooks = trainer.hooks();
  if (setup_.shard_params()) {
    // A replica's ranks hold its parts (ZeRO-3): each micro-batch's gradients reduced to them as its backward
    // goes, over the replica (under expert parallelism each rank's experts over itself alone).
    shards_ = std::make_unique<TrainerShards>(trainer, mesh_->replica_group(),
                                              mesh_->expert_group ? mesh_->shard_group.get() : nullptr,
                                              setup_.expert_parallel());
  }
  edit_ = std::make_unique<Edit>(std::move(*mesh_), setup_.edit(), trainer.parameters(), setup_.model(),
                                 routed_expert_ranges(trainer.parameters()));
  mesh_.reset();
  hooks.after_backward = [this](FlatParameters&) { edit_->reduce_gradients(trainer_->state().step); };
  hooks.complete_grad_sum_squares = [this](double own) { return edit_->complete_grad_sum_squares(own); };
  hooks.after_update = [this](FlatParameters&) { edit_->share_updated_shard(); };
  // The ranks whose gradients are averaged: every rank during the warmup, a replica's after it.
  hooks.mean_loss_units = [this](double units) {
    const bool warm = trainer_->state().step < setup_.edit().local_sgd_warmup;
    return mean_over(warm ? setup_.world() : edit_->mesh().replica_group(), units);
  };
}

void EditStrategy::before_step(RunControl& run) {
  if (!edit_->has_anchor() && run.state().step >= setup_.edit().local_sgd_warmup) {
    edit_->sync(0);
    steps_since_sync_ = 0;
  }
}

Json EditStrategy::after_step(RunControl& run, const StepStats& stats) {
  if (stats.decision != UpdateDecision::Retry) ++steps_since_sync_;
  if (!edit_->sync_due(run.state().step)) return nullptr;
  const SyncReport report = edit_->sync(steps_since_sync_);
  steps_since_sync_ = 0;
  return sync_record(report);
}

Json EditStrategy::sync_record(const SyncReport& r) {
  return Json{{"dropped", r.dropped}, {"skipped_layers", r.skipped_layers}, {"pseudo_grad_norm", r.mean_norm},
              {"seconds", r.seconds}};
}

void EditStrategy::finish(RunControl& run) {
  const bool stopped_as_asked = run.stopped() == RunControl::Stop::Asked;
  if (!stopped_as_asked && steps_since_sync_ > 0 && edit_->mesh().replicas() > 1) {
    edit_->sync(steps_since_sync_);
    steps_since_sync_ = 0;
  }
}

NamedTensors EditStrategy::own_tensors() const {
  const FlatParameters::Range owned = trainer_->optimizer().owned();
  NamedTensors own = {{"values", trainer_->parameters().values().narrow(owned.begin, owned.size())}};
  for (const auto& t : trainer_->optimizer().shard_state()) own.push_back(t);
  for (const auto& t : edit_->state_tensors()) own.push_back(t);
  return own;
}

Json EditStrategy::own_json() const {
  return {{"adamw_steps", trainer_->optimizer().steps_taken()},
          {"edit", edit_->state_json()},
          {"steps_since_sync", steps_since_sync_}};
}

void EditStrategy::load_own(const SafetensorsFile& file, const JsonObject& own) {
  const std::string& path = own.source();
  const FlatParameters::Range owned = trainer_->optimizer().owned();
  trainer_->optimizer().load_shard_state({{"exp_avg", file.get("exp_avg")}, {"exp_avg_sq", file.get("exp_avg_sq")}},
                                         own.get<int64_t>("adamw_steps"), path);
  trainer_->parameters().values().narrow(owned.begin, owned.size()).copy_from(file.get("values", {owned.size()}, DType::F32));
  trainer_->values_changed();
  edit_->load_state(file.tensors, own.object("edit").json(), path);
  edit_->share_updated_shard();
  steps_since_sync_ = own.get<int64_t>("steps_since_sync");
}

}  // namespace lt
