// How the processes of a run train together: data parallel, EDiT and A-EDiT (dist/) as one interface.
// Each strategy owns the shape of its loop over a stage and its hooks on the trainer; what every loop
// does after a step (held-out figures, metrics, checkpoints, the stop) it hands to RunControl.
//   data parallel  every rank takes every step together; the gradients are averaged after the backward
//   EDiT           the same lockstep loop; a replica's ranks share its optimiser (ZeRO-2) and the
//                  replicas sync their parameters layer by layer every --sync-interval steps
//   A-EDiT         after its warmup, each replica steps at its own pace in rounds ended by a timer
#pragma once
#include <cstdint>
#include <memory>

#include "dist/parameter_shards.h"
#include "trainer/run_control.h"

namespace lt {

class DistributionStrategy {
 public:
  virtual ~DistributionStrategy() = default;
  // Before the trainer exists: how its optimiser is sharded across ranks.
  virtual void configure(TrainerSettings&) {}
  // Installs the strategy's hooks on the trainer (what happens to the gradients after the backward).
  virtual void attach(Trainer& trainer) = 0;
  // The ranks whose spike guards decide together.
  virtual Communicator& agreeing() = 0;
  // Whether every rank can go back to the last checkpoint together after non-finite steps.
  virtual bool can_reload() const { return true; }
  // This rank's own part of a checkpoint, where the ranks differ (null: rank 0's state is everyone's).
  virtual RankState* rank_state() { return nullptr; }
  // Under parameter sharding: what holds each rank's part of the model (null: every rank holds all of it).
  virtual ParameterShards* parameter_shards() { return nullptr; }
  // Runs the current stage of run.state() to its end or to a stop.
  virtual void run_stage(RunControl& run) = 0;
  // After the last stage, or a stop: what makes the checkpoint and the final figures the one model
  // every rank agrees on.
  virtual void finish(RunControl&) {}
  // The bytes this rank has sent to the others.
  virtual int64_t bytes_sent() const = 0;
};

// The strategy of setup.dist(); collective (EDiT builds its mesh of processes here).
std::unique_ptr<DistributionStrategy> make_strategy(RunSetup& setup);

// Where the MoE layers' stacked routed experts sit in the flat buffers (expert parallelism: the stretches
// in which the ranks of an expert-parallel group differ), in order.
std::vector<FlatParameters::Range> routed_expert_ranges(const FlatParameters& params);

}  // namespace lt
