// EDiT and A-EDiT as distribution strategies (trainer/strategy.h; the algorithm is dist/edit.h). EDiT
// runs the lockstep loop with its anchor and syncs around the steps; A-EDiT runs that loop for its
// synchronous warmup, then rounds in which each replica steps at its own pace (aedit_strategy.cpp).
// Both keep every rank's own shard of the optimiser and of the anchor in the checkpoint (RankState). Under
// --shard-params a replica's ranks hold parts of every layer (ZeRO-3, dist/parameter_shards.h) rather than
// whole values with shards of the gradients and optimiser (ZeRO-2).
#pragma once
#include <memory>
#include <optional>

#include "dist/edit.h"
#include "trainer/lockstep_strategy.h"

namespace lt {

class EditStrategy : public LockstepStrategy, public RankState {
 public:
  // Builds the mesh of processes (collective over the world).
  explicit EditStrategy(RunSetup& setup);
  void configure(TrainerSettings& settings) override;
  void attach(Trainer& trainer) override;
  Communicator& agreeing() override { return setup_.world(); }
  RankState* rank_state() override { return this; }
  ParameterShards* parameter_shards() override { return shards_ ? &shards_->shards() : nullptr; }
  void run_stage(RunControl& run) override { run_lockstep(run, run.stage().steps); }
  // A finished EDiT run (or one out of time) ends with a sync, so the checkpoint and the held-out
  // figures are of the one model every replica agrees on. A run stopped with --stop-at does not: its
  // resume must continue exactly as if it had never stopped.
  void finish(RunControl& run) override;
  int64_t bytes_sent() const override {
    return setup_.world().bytes_sent() + edit_->bytes_sent() + setup_.expert_bytes_sent();
  }

  NamedTensors own_tensors() const override;
  Json own_json() const override;
  void load_own(const SafetensorsFile& file, const JsonObject& own) override;

 protected:
  // The anchor is taken as local steps begin; a sync then follows every sync_interval-th step, so
  // evaluations and checkpoints at those steps see the synchronised model.
  void before_step(RunControl& run) override;
  Json after_step(RunControl& run, const StepStats& stats) override;
  static Json sync_record(const SyncReport& report);

  RunSetup& setup_;
  std::optional<EditMesh> mesh_;  // until attach() hands it to edit_
  std::unique_ptr<TrainerShards> shards_;  // under --shard-params
  std::unique_ptr<Edit> edit_;
  Trainer* trainer_ = nullptr;
  int64_t steps_since_sync_ = 0;  // this replica's steps since the last sync
};

class AEditStrategy : public EditStrategy {
 public:
  using EditStrategy::EditStrategy;
  // A replica's ranks decide together; the replicas never wait for each other.
  Communicator& agreeing() override { return edit_->mesh().replica_group(); }
  bool can_reload() const override { return false; }
  void run_stage(RunControl& run) override;

 private:
  void run_rounds(RunControl& run);
};

}  // namespace lt
