// The spike guard's verdicts on hand-made streams: quiet during its warmup, retries a spike up to its
// limit and then accepts it, cuts the learning rate for a cooling period after repeated spikes, turns
// non-finite steps into retries and then a reload that cuts the rate for good, stops after too many
// reloads, and carries all of it through its JSON state.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optim/spike_guard.h"
#include "tensor/error.h"

namespace lt {
namespace {

using Action = SpikeGuard::Action;

SpikeGuardSettings small_settings() {
  SpikeGuardSettings s;
  s.detector = {/*alpha=*/0.1, /*warmup_steps=*/10, /*threshold=*/6.0};
  s.max_retries = 2;
  s.spikes_to_cut = 2;
  s.cut_window = 50;
  s.lr_cut = 0.5;
  s.cooldown_steps = 20;
  s.bad_steps_to_reload = 3;
  s.max_reloads = 1;
  return s;
}

// A loss around 2 and a gradient norm around 1, with a little deterministic wobble.
void feed_quiet_steps(SpikeGuard& guard, int64_t first, int64_t count) {
  for (int64_t step = first; step < first + count; ++step) {
    const double wobble = 0.01 * static_cast<double>((step * 7) % 5);
    EXPECT_EQ(guard.judge(step, 2.0 + wobble, 1.0 + wobble).action, Action::Apply) << "step " << step;
  }
}

TEST(SpikeGuard, NothingIsASpikeDuringTheWarmup) {
  SpikeGuard guard(small_settings());
  EXPECT_EQ(guard.judge(0, 2.0, 1.0).action, Action::Apply);
  EXPECT_EQ(guard.judge(1, 500.0, 300.0).action, Action::Apply);
}

TEST(SpikeGuard, RetriesASpikeThenAcceptsIt) {
  SpikeGuard guard(small_settings());
  feed_quiet_steps(guard, 0, 30);
  SpikeGuard::Verdict v = guard.judge(30, 40.0, 1.0);
  EXPECT_EQ(v.action, Action::Retry);
  EXPECT_EQ(v.kind, "loss");
  EXPECT_GT(v.z, 6.0);
  EXPECT_EQ(guard.judge(30, 40.0, 1.0).action, Action::Retry);
  EXPECT_EQ(guard.judge(30, 40.0, 1.0).action, Action::Accept) << "after max_retries the step is taken";
  // A gradient-norm spike alone counts too.
  EXPECT_EQ(guard.judge(31, 2.0, 1e6).kind, "grad_norm");
}

TEST(SpikeGuard, RepeatedSpikesCutTheRateForTheCooldown) {
  SpikeGuard guard(small_settings());
  feed_quiet_steps(guard, 0, 30);
  EXPECT_EQ(guard.lr_factor(30), 1.0);
  EXPECT_EQ(guard.judge(30, 40.0, 1.0).action, Action::Retry);
  EXPECT_EQ(guard.lr_factor(30), 1.0) << "one spike does not cut";
  EXPECT_EQ(guard.judge(30, 2.0, 1.0).action, Action::Apply);
  EXPECT_EQ(guard.judge(31, 40.0, 1.0).action, Action::Retry);
  EXPECT_EQ(guard.lr_factor(31), 0.5);
  EXPECT_EQ(guard.lr_factor(50), 0.5);
  EXPECT_EQ(guard.lr_factor(51), 1.0) << "the cut lasts cooldown_steps (20) from the second spike";
}

TEST(SpikeGuard, NonFiniteStepsRetryThenReloadThenStop) {
  SpikeGuard guard(small_settings());
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(guard.judge(5, nan, 1.0).action, Action::Retry);
  EXPECT_EQ(guard.judge(5, 2.0, inf).kind, "nonfinite");
  EXPECT_EQ(guard.judge(5, nan, nan).action, Action::Reload);
  guard.reloaded();
  EXPECT_EQ(guard.lr_factor(0), 0.5) << "a reload lowers the rate for good";
  EXPECT_EQ(guard.judge(5, 2.0, 1.0).action, Action::Apply);
  EXPECT_EQ(guard.judge(6, nan, 1.0).action, Action::Retry) << "a good step resets the count";
  EXPECT_EQ(guard.judge(6, nan, 1.0).action, Action::Retry);
  EXPECT_EQ(guard.judge(6, nan, 1.0).action, Action::Reload);
  EXPECT_THROW(guard.reloaded(), Error) << "max_reloads is 1";
}

TEST(SpikeGuard, OffStillKeepsNonFiniteStepsOut) {
  SpikeGuardSettings settings = small_settings();
  settings.enabled = false;
  SpikeGuard guard(settings);
  feed_quiet_steps(guard, 0, 30);
  EXPECT_EQ(guard.judge(30, 1e9, 1e9).action, Action::Apply);
  EXPECT_EQ(guard.judge(31, std::nan(""), 1.0).action, Action::Retry);
}

TEST(SpikeGuard, StateRoundTripsExactly) {
  SpikeGuard guard(small_settings()), copy(small_settings());
  feed_quiet_steps(guard, 0, 30);
  guard.judge(30, 40.0, 1.0);
  copy.load(parse_json(guard.to_json().dump(), "state"), "state");
  EXPECT_EQ(copy.to_json(), guard.to_json());
  for (int64_t step = 30; step < 40; ++step) {
    const double loss = step == 35 ? 50.0 : 2.0;
    const SpikeGuard::Verdict a = guard.judge(step, loss, 1.0), b = copy.judge(step, loss, 1.0);
    EXPECT_EQ(a.action, b.action);
    EXPECT_EQ(a.z, b.z);
  }
  EXPECT_THROW(copy.load(parse_json(R"({"loss": 1})", "bad"), "bad"), Error);
}

}  // namespace
}  // namespace lt
