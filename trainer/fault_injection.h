// Test-only faults (--inject), behind one seam as the communicator is: the stage's objective passes
// through FaultInjector::wrap, and the spike guard tells it when an attempt at a step has been judged.
// Without injections both do nothing, so the run reads the same with or without them.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "trainer/trainer.h"

namespace lt {

// At step `step`, the loss of the first `count` attempts is multiplied by `factor` (Spike; its gradients
// with it) or made NaN (Nan); or rank `rank` stops answering in the step's forward (Hang: it sleeps for
// ever, and the other ranks wait for it in the step's collectives, which is what the hang watchdog is for).
struct Injection {
  enum class Kind { Spike, Nan, Hang };
  Kind kind = Kind::Spike;
  int64_t step = 0;
  double factor = 1;
  int64_t count = 1;
  int rank = 0;
};

class FaultInjector {
 public:
  // rank: this process's rank in the world.
  FaultInjector(std::vector<Injection> injections, int rank) : injections_(std::move(injections)), rank_(rank) {}
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  // `objective` with the injected faults; `objective` itself when there are none.
  Objective wrap(Objective objective);
  // An attempt at `step` reached the update decision: the next attempt is the next one counted.
  void attempt_judged(int64_t step);

 private:
  std::vector<Injection> injections_;
  int rank_;
  std::map<int64_t, int64_t> attempts_;  // judged attempts per injected step
};

}  // namespace lt
