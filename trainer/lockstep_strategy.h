// The loop of the strategies whose ranks take every step together (data parallel, EDiT, and A-EDiT's
// synchronous warmup), with the seams EDiT needs around a step (trainer/strategy.h).
#pragma once
#include <cstdint>

#include "dist/data_parallel.h"
#include "trainer/strategy.h"

namespace lt {

class LockstepStrategy : public DistributionStrategy {
 protected:
  explicit LockstepStrategy(Communicator& world) : data_parallel_(world) {}
  // Steps the current stage until its step `end`; returns whether the run stopped.
  bool run_lockstep(RunControl& run, int64_t end);
  virtual void before_step(RunControl&) {}
  // After a step, before the ranks exchange its statistics: the record of a sync the step ended with
  // (null: none).
  virtual Json after_step(RunControl&, const StepStats&) { return nullptr; }
  // The mean of `value` over `ranks` (the same f64 on every one of them; collective).
  static double mean_over(Communicator& ranks, double value);

  DataParallel data_parallel_;
};

}  // namespace lt
