// Profiling inside a training run (--profile-every N): the step whose record is step N, 2N, ... is timed
// op by op (autograd/profile.h: each op family's self time, forward and backward, and the optimiser),
// with the thread pool's waits and each collective's time and bytes (dist/watchdog.h). At the log point
// that follows, every rank's profile is gathered into rank 0's metrics record under "profile" (an array by
// rank): the ops, the pool's waits, the collectives by operation, and the step's timeline (its phases and
// its collectives in milliseconds from the step's start). The training report draws them: a bar per op
// family and a timeline per rank.
//
// Off (N = 0) nothing is switched on and nothing gathered. On, the profiled step pays a few hundred
// nanoseconds per op and the log point one gather of a few KB per rank (docs/reliability.md has the
// overhead at N = 50).
#pragma once
#include <chrono>
#include <cstdint>

#include "dist/communicator.h"
#include "io/json.h"

namespace lt {

class StepProfiler {
 public:
  StepProfiler(Communicator& world, int64_t every) : world_(world), every_(every) {}

  // Around the step that leaves `steps_after` steps taken (a step retried on other data is profiled again).
  void begin(int64_t steps_after);
  void end();
  // Collective when a profiled step's record lies in (step_before, step] (every rank agrees on that):
  // rank 0's record gets every rank's profile.
  void at_log_point(int64_t step_before, int64_t step, Json& record);

 private:
  bool due(int64_t steps_after) const { return every_ > 0 && steps_after % every_ == 0; }

  Communicator& world_;
  int64_t every_;
  bool active_ = false;
  int64_t step_ = 0, start_ns_ = 0, pool_wait_start_ns_ = 0;
  Json profile_;  // this rank's latest, until gathered
};

}  // namespace lt
