#include "trainer/strategy.h"

#include "trainer/edit_strategy.h"
#include "trainer/lockstep_strategy.h"

namespace lt {

namespace {

class DataParallelStrategy : public LockstepStrategy {
 public:
  explicit DataParallelStrategy(RunSetup& setup) : LockstepStrategy(setup.world()), setup_(setup) {}
  void attach(Trainer& trainer) override {
    trainer.hooks().after_backward = [this](FlatParameters& params) { data_parallel_.average(params, setup_.model()); };
  }
  Communicator& agreeing() override { return setup_.world(); }
  void run_stage(RunControl& run) override { run_lockstep(run, run.stage().steps); }
  int64_t bytes_sent() const override { return setup_.world().bytes_sent(); }

 private:
  RunSetup& setup_;
};

}  // namespace

std::unique_ptr<DistributionStrategy> make_strategy(RunSetup& setup) {
  switch (setup.dist()) {
    case DistMode::DataParallel: return std::make_unique<DataParallelStrategy>(setup);
    case DistMode::Edit: return std::make_unique<EditStrategy>(setup);
    case DistMode::AEdit: return std::make_unique<AEditStrategy>(setup);
  }
  return nullptr;
}

}  // namespace lt
