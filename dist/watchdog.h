// The hang watchdog (--collective-timeout): a collective that never returns, because a rank stopped
// answering, would otherwise hold every rank for ever. A thread of the process watches two things, the
// collective this rank is waiting in (its operation and bytes) and the training step it is running; when
// the collective (or, outside collectives, the step) has lasted longer than the timeout it prints one
// line naming this rank, what it waited in and for how long, and ends the process with exit code 3, as a
// rank that fails does (abort_all_ranks): the launcher then ends the others, whose own watchdogs would
// fire too. Nothing is written on the way out,
// so the last checkpoint stays as it was (a write in flight is a staging folder, never the checkpoint).
//
// The marks are a few atomic operations each, so the watched paths cost nothing measurable; off (timeout
// 0) no thread runs. They also count the time spent in collectives (the slow-rank check,
// trainer/slow_ranks.h) and, for a profiled step, list them (trainer/step_profiler.h). On a GPU the
// collectives are NCCL calls queued on a stream, so a hang shows as a step that does not end.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace lt {

// The watchdog of this process while it lives (one at a time); rank names it in the line (-1: a process
// alone). timeout_seconds 0: off.
class HangWatchdog {
 public:
  HangWatchdog(double timeout_seconds, int rank);
  ~HangWatchdog();
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

 private:
  class Thread;
  std::unique_ptr<Thread> thread_;
};

// The clock of the marks (steady, in nanoseconds): a profiled step's times are read on it too, so that
// its collectives' start and end fall on the same axis as the step's.
int64_t watch_clock_ns();

// The seconds this process has spent in collectives so far (on any thread): what the slow-rank check takes
// from a rank's time to see how long it computed.
double collective_seconds();

// The collectives of a profiled step (--profile-every): while recording is on, each one's operation,
// bytes and steady-clock start and end in nanoseconds are kept; take_collective_records() hands them over
// and empties the list.
struct CollectiveRecord {
  const char* operation = "";
  int64_t bytes = 0, start_ns = 0, end_ns = 0;
};
void record_collectives(bool on);
std::vector<CollectiveRecord> take_collective_records();

// While one lives, this rank waits in a collective: `operation` (a string literal: "all_reduce") of `bytes`.
class WatchedCollective {
 public:
  WatchedCollective(const char* operation, int64_t bytes);
  ~WatchedCollective();
  WatchedCollective(const WatchedCollective&) = delete;
  WatchedCollective& operator=(const WatchedCollective&) = delete;
};

// While one lives, this rank runs training step `step`.
class WatchedStep {
 public:
  explicit WatchedStep(int64_t step);
  ~WatchedStep();
  WatchedStep(const WatchedStep&) = delete;
  WatchedStep& operator=(const WatchedStep&) = delete;
};

}  // namespace lt
