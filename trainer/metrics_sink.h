// Where a run's figures go, on rank 0: metrics.jsonl (one record per step or A-EDiT round, and one
// with the held-out figures at the end), the live progress line, and the event lines between. The
// other ranks write nothing.
#pragma once
#include <cstdio>
#include <string>

#include "io/json.h"
#include "io/metrics.h"
#include "trainer/progress.h"

namespace lt {

class MetricsSink {
 public:
  // path: metrics.jsonl ("" on ranks other than 0). A resumed run (resumed_step >= 0) keeps the log's
  // records through its checkpoint's step and goes on from there; a fresh one starts the log anew.
  MetricsSink(std::FILE* out, bool lead, const std::string& path, int64_t resumed_step, int64_t total_steps,
              int64_t first_step);

  void write(const Json& record) { log_.write(record); }
  // A step's or round's record on the progress line (its held-out loss, when it has one, as an event),
  // `elapsed` seconds into the run.
  void show(const Json& record, double loss, double lr, double grad_norm, double elapsed);
  void event(const std::string& line) { progress_.event(line); }
  // Leaves the in-place progress line, before other output.
  void finish() { progress_.finish(); }

 private:
  MetricsLog log_;
  ProgressLine progress_;
};

}  // namespace lt
