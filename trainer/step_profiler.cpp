#include "trainer/step_profiler.h"

#include <map>
#include <string>
#include <vector>

#include "autograd/profile.h"
#include "dist/watchdog.h"
#include "tensor/threadpool.h"

namespace lt {

namespace {

double ms(int64_t ns) { return static_cast<double>(ns) * 1e-6; }

}  // namespace

void StepProfiler::begin(int64_t steps_after) {
  if (!due(steps_after)) return;
  active_ = true;
  step_ = steps_after;
  profile::reset();
  take_collective_records();
  record_collectives(true);
  profile::enable();
  pool_wait_start_ns_ = pool_wait_ns();
  start_ns_ = watch_clock_ns();
}

void StepProfiler::end() {
  if (!active_) return;
  active_ = false;
  const int64_t end_ns = watch_clock_ns();
  profile::disable();
  record_collectives(false);
  Json ops = Json::array();
  for (const profile::OpTime& op : profile::report())
    ops.push_back({{"op", op.name},
                   {"phase", profile::phase_name(op.phase)},
                   {"ms", op.seconds * 1e3},
                   {"calls", op.calls},
                   {"pool_wait_ms", op.wait_seconds * 1e3}});
  Json timeline = Json::array();
  for (const profile::Segment& s : profile::timeline())
    timeline.push_back({{"part", profile::phase_name(s.phase)},
                        {"start_ms", ms(s.start_ns - start_ns_)},
                        {"end_ms", ms(s.end_ns - start_ns_)}});
  struct Totals {
    int64_t calls = 0, bytes = 0, ns = 0;
  };
  std::map<std::string, Totals> by_operation;
  for (const CollectiveRecord& c : take_collective_records()) {
    Totals& t = by_operation[c.operation];
    ++t.calls;
    t.bytes += c.bytes;
    t.ns += c.end_ns - c.start_ns;
    timeline.push_back({{"part", c.operation},
                        {"collective", true},
                        {"bytes", c.bytes},
                        {"start_ms", ms(c.start_ns - start_ns_)},
                        {"end_ms", ms(c.end_ns - start_ns_)}});
  }
  Json collectives = Json::array();
  for (const auto& [operation, t] : by_operation)
    collectives.push_back({{"op", operation}, {"calls", t.calls}, {"bytes", t.bytes}, {"ms", ms(t.ns)}});
  profile_ = {{"rank", world_.rank()},
              {"step", step_},
              {"step_ms", ms(end_ns - start_ns_)},
              {"pool_wait_ms", ms(pool_wait_ns() - pool_wait_start_ns_)},
              {"ops", ops},
              {"collectives", collectives},
              {"timeline", timeline}};
}

void StepProfiler::at_log_point(int64_t step_before, int64_t step, Json& record) {
  if (every_ <= 0 || step / every_ == step_before / every_) return;
  Json ranks = Json::array();
  if (world_.size() == 1) {
    ranks.push_back(profile_);
  } else {
    const std::vector<std::string> texts = gather_text(world_, profile_.is_null() ? "null" : profile_.dump(), 0);
    for (const std::string& text : texts) ranks.push_back(Json::parse(text));
  }
  profile_ = Json();
  if (world_.rank() == 0) record["profile"] = ranks;
}

}  // namespace lt
