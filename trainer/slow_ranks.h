// Slow ranks (--slow-rank-factor): on uneven hardware one rank's slowness is every rank's, since the
// others wait for it in each collective, so the run names it. At every log point (a step; an A-EDiT
// round) each rank's time since the last one is gathered, split into its parts: forward, backward and
// optimiser (the steps' own figures), its waits in collectives (dist/watchdog.h), and the rest of its
// time outside them. A rank's busy time per step is its time less its waits, over its steps (under
// A-EDiT a slow replica takes fewer steps in a round, and its busy time per step is larger). A rank whose
// busy time per step exceeds the median rank's (the lower middle one of an even count) by the factor at
// kSlowPointsInARow log points in a row is slow: the progress log gets a line naming it and the part of
// its step with the largest excess over the median, once as it turns slow and once as it recovers, and
// the record of every log point while it is slow names it ("slow_ranks"). Every record of a multi-rank
// run holds each rank's busy time per step ("rank_step_s").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "io/json.h"
#include "trainer/trainer.h"

namespace lt {

class SlowRanks {
 public:
  static constexpr int kSlowPointsInARow = 3;
  // factor 0: no check (the gathering stays, for the records).
  SlowRanks(Communicator& world, double factor);

  // A step of this rank (counted into the next log point).
  void add_step(const StepStats& stats);
  // Where a log point's interval ends (as the log point begins) and where the next one begins (as it
  // ends): what happens in between, the held-out figures and the checkpoint that rank 0 takes alone while
  // the others wait, is no rank's step time.
  void end_interval();
  void begin_interval();
  // Collective over the world at a log point (every rank at the same points), after end_interval. Adds
  // the figures to `record` and returns the lines to print (rank 0's; none elsewhere).
  std::vector<std::string> at_log_point(Json& record);

 private:
  Communicator& world_;
  double factor_;
  double forward_ = 0, backward_ = 0, optimizer_ = 0;
  int64_t steps_ = 0;
  double interval_start_, interval_start_waits_, interval_end_ = 0, interval_end_waits_ = 0;
  std::vector<int> slow_in_a_row_;  // per rank (rank 0's)
};

}  // namespace lt
