#include "trainer/strategy.h"

#include <memory>

#include "model/hf_names.h"
#include "trainer/edit_strategy.h"
#include "trainer/lockstep_strategy.h"

namespace lt {

namespace {

class DataParallelStrategy : public LockstepStrategy {
 public:
  explicit DataParallelStrategy(RunSetup& setup) : LockstepStrategy(setup.world()), setup_(setup) {}
  void configure(TrainerSettings& settings) override {
    if (!setup_.shard_params()) return;
    settings.layer_shards = {setup_.world().rank(), setup_.world().size()};
    if (Communicator* copies = setup_.expert_copies()) {
      settings.layer_shards.is_experts = is_stacked_experts;
      settings.layer_shards.expert_rank = copies->rank();
      settings.layer_shards.expert_ranks = copies->size();
    }
  }
  // The average overlaps the last backward (OverlappedAverage) unless --overlap-grads 0 or the MPI library
  // lets only the main thread call it; both give the same bits. Under expert parallelism it follows the
  // backward: the backward itself exchanges rows through the communicator, which one thread at a time may
  // call (MPI_THREAD_SERIALIZED), so a bucket's all-reduce could not run beside it.
  void attach(Trainer& trainer) override {
    Communicator& world = setup_.world();
    overlapped_.reset();
    trainer.hooks().mean_loss_units = [&world](double units) { return mean_over(world, units); };
    if (setup_.shard_params()) {
      // Each micro-batch's gradients are reduced to their shards as its backward goes (ParameterShards).
      shards_ = std::make_unique<TrainerShards>(trainer, world, setup_.expert_copies(), setup_.expert_parallel());
      trainer.hooks().after_backward = [this](FlatParameters&) { data_parallel_.average_buffers(setup_.model()); };
      trainer.hooks().complete_grad_sum_squares = [this](double own) {
        return shards_->shards().grad_sum_squares(own);
      };
      return;
    }
    if (setup_.expert_group() != nullptr) {
      data_parallel_.set_expert_parallel(*setup_.expert_group(), *setup_.expert_copies(),
                                         routed_expert_ranges(trainer.parameters()));
      trainer.hooks().complete_grad_sum_squares = [this, &trainer](double) {
        return data_parallel_.grad_sum_squares(trainer.parameters());
      };
    } else if (setup_.options().overlap_grads && world.size() > 1 && world.callable_from_another_thread()) {
      overlapped_ = std::make_unique<OverlappedAverage>(data_parallel_, trainer.parameters());
      trainer.hooks().gradient_ready = [this](size_t index) { overlapped_->gradient_ready(index); };
      trainer.hooks().after_backward = [this](FlatParameters& params) {
        overlapped_->finish(params, setup_.model());
      };
      return;
    }
    trainer.hooks().after_backward = [this](FlatParameters& params) { data_parallel_.average(params, setup_.model()); };
  }
  Communicator& agreeing() override { return setup_.world(); }
  ParameterShards* parameter_shards() override { return shards_ ? &shards_->shards() : nullptr; }
  void run_stage(RunControl& run) override { run_lockstep(run, run.stage().steps); }
  int64_t bytes_sent() const override { return setup_.world().bytes_sent() + setup_.expert_bytes_sent(); }

 private:
  RunSetup& setup_;
  std::unique_ptr<OverlappedAverage> overlapped_;
  std::unique_ptr<TrainerShards> shards_;
};

}  // namespace

std::vector<FlatParameters::Range> routed_expert_ranges(const FlatParameters& params) {
  std::vector<FlatParameters::Range> ranges;
  for (const FlatParameters::ParameterRange& p : params.parameters())
    if (is_stacked_experts(p.parameter.name)) ranges.push_back(p.range);
  return ranges;
}

std::unique_ptr<DistributionStrategy> make_strategy(RunSetup& setup) {
  switch (setup.dist()) {
    case DistMode::DataParallel: return std::make_unique<DataParallelStrategy>(setup);
    case DistMode::Edit: return std::make_unique<EditStrategy>(setup);
    case DistMode::AEdit: return std::make_unique<AEditStrategy>(setup);
  }
  return nullptr;
}

}  // namespace lt
