#include "trainer/slow_ranks.h"

#include <algorithm>

#include "dist/watchdog.h"
#include "io/format_text.h"

namespace lt {

namespace {

// The median, the lower middle value for an even count: of two ranks, the faster one (the mean of the two
// would hide a rank twice as slow as the other below a factor of 1.5).
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[(values.size() - 1) / 2];
}

// The parts of a rank's time that each log point gathers, per step.
enum Part { kForward, kBackward, kOptimizer, kWaits, kOutside, kParts };
const char* const kPartNames[kParts] = {"forward", "backward", "optimizer", "waits in collectives",
                                        "outside the step"};

}  // namespace

SlowRanks::SlowRanks(Communicator& world, double factor)
    : world_(world),
      factor_(factor),
      interval_start_(static_cast<double>(watch_clock_ns()) * 1e-9),
      interval_start_waits_(collective_seconds()),
      slow_in_a_row_(static_cast<size_t>(world.size()), 0) {}

void SlowRanks::add_step(const StepStats& stats) {
  forward_ += stats.forward_seconds;
  backward_ += stats.backward_seconds;
  optimizer_ += stats.optimizer_seconds;
  ++steps_;
}

void SlowRanks::end_interval() {
  interval_end_ = static_cast<double>(watch_clock_ns()) * 1e-9;
  interval_end_waits_ = collective_seconds();
}

void SlowRanks::begin_interval() {
  interval_start_ = static_cast<double>(watch_clock_ns()) * 1e-9;
  interval_start_waits_ = collective_seconds();
}

std::vector<std::string> SlowRanks::at_log_point(Json& record) {
  const double interval = interval_end_ - interval_start_;
  const double waits = interval_end_waits_ - interval_start_waits_;
  const double per_step = 1.0 / static_cast<double>(std::max<int64_t>(steps_, 1));
  // Per step: the parts, and the busy time (the interval less the waits) last.
  std::vector<double> own(kParts + 1);
  own[kForward] = forward_ * per_step;
  own[kBackward] = backward_ * per_step;
  own[kOptimizer] = optimizer_ * per_step;
  own[kWaits] = waits * per_step;
  // The gradient average that overlaps the backward waits on its own thread, so the parts may add up to
  // more than the interval: the rest is never negative.
  own[kOutside] = std::max(0.0, interval - forward_ - backward_ - optimizer_ - waits) * per_step;
  own[kParts] = (interval - waits) * per_step;
  forward_ = backward_ = optimizer_ = 0;
  steps_ = 0;
  const int ranks = world_.size();
  Tensor mine = Tensor::from_vector<double>({kParts + 1}, own);
  Tensor all = Tensor::empty({(kParts + 1) * ranks}, DType::F64);
  world_.all_gather(mine, all);
  if (world_.rank() != 0) return {};
  const std::vector<double> figures = all.to_vector<double>();
  auto figure = [&](int rank, int part) { return figures[static_cast<size_t>(rank * (kParts + 1) + part)]; };
  std::vector<double> busy(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) busy[static_cast<size_t>(r)] = figure(r, kParts);
  record["rank_step_s"] = busy;
  std::vector<std::string> lines;
  if (factor_ <= 0) return lines;
  const double typical = median(busy);
  Json slow = Json::array();
  const int64_t step = record.value("step", int64_t{0});
  for (int r = 0; r < ranks; ++r) {
    int& in_a_row = slow_in_a_row_[static_cast<size_t>(r)];
    const bool slow_now = typical > 0 && busy[static_cast<size_t>(r)] > factor_ * typical;
    const bool was_slow = in_a_row >= kSlowPointsInARow;
    in_a_row = slow_now ? in_a_row + 1 : 0;
    if (in_a_row < kSlowPointsInARow) {
      if (was_slow)
        lines.push_back(format_text("step %lld: rank %d is no longer slow", static_cast<long long>(step), r));
      continue;
    }
    // The part of its step furthest above the median rank's.
    int worst = kForward;
    double worst_excess = -1;
    for (int part = kForward; part < kParts; ++part) {
      if (part == kWaits) continue;  // waiting is what the other ranks do for it
      std::vector<double> of_part(static_cast<size_t>(ranks));
      for (int q = 0; q < ranks; ++q) of_part[static_cast<size_t>(q)] = figure(q, part);
      const double excess = figure(r, part) - median(of_part);
      if (excess > worst_excess) worst = part, worst_excess = excess;
    }
    const double times = busy[static_cast<size_t>(r)] / typical;
    slow.push_back({{"rank", r}, {"times_median", times}, {"part", kPartNames[worst]}, {"excess_s", worst_excess}});
    if (in_a_row == kSlowPointsInARow)
      lines.push_back(format_text("step %lld: rank %d is slow: %.2fx the median rank's time per step for %d log "
                                  "points in a row, most of it %s (+%.3f s a step)",
                                  static_cast<long long>(step), r, times, kSlowPointsInARow, kPartNames[worst],
                                  worst_excess));
  }
  if (!slow.empty()) record["slow_ranks"] = slow;
  return lines;
}

}  // namespace lt
