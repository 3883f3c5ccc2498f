// Learning-rate schedules and batch-size warmup.
#include <gtest/gtest.h>

#include "optim/schedule.h"
#include "tensor/error.h"

namespace lt {
namespace {

TEST(LRSchedule, WarmupStableHalving) {
  LRSchedule s{"wsd", 2.4e-4, 0.0, 4, 100, 0.6};
  EXPECT_DOUBLE_EQ(s.at(0, 0.0), 0.6e-4);  // linear warmup over 4 steps
  EXPECT_DOUBLE_EQ(s.at(3, 0.03), 2.4e-4);
  EXPECT_DOUBLE_EQ(s.at(50, 0.59), 2.4e-4);
  EXPECT_DOUBLE_EQ(s.at(61, 0.6), 1.2e-4);  // halved once 60% of the tokens are consumed
}

TEST(LRSchedule, CosineAndInverseSqrtEndAtMinLr) {
  LRSchedule cosine{"cosine", 1e-3, 1e-5, 10, 110, 0.6};
  EXPECT_DOUBLE_EQ(cosine.at(10, 0), 1e-3);
  EXPECT_NEAR(cosine.at(109, 1), 1e-5, 1e-12);
  EXPECT_NEAR(cosine.at(60, 0.5), 0.5 * (1e-3 + 1e-5), 1e-5);
  LRSchedule inv{"inverse_sqrt", 1.2e-4, 1.2e-8, 0, 1001, 0.6};
  EXPECT_DOUBLE_EQ(inv.at(0, 0), 1.2e-4);
  EXPECT_NEAR(inv.at(1000, 1), 1.2e-8, 1e-14);
  for (int64_t s = 1; s < 1001; ++s) EXPECT_LT(inv.at(s, 0), inv.at(s - 1, 0));
}

TEST(LRSchedule, RejectsUnknownKinds) {
  LRSchedule s;
  s.kind = "linear-ish";
  EXPECT_THROW(s.validate(), Error);
}

TEST(BatchRamp, RampsLinearlyThenHolds) {
  BatchRamp ramp{4, 16, 6};
  EXPECT_EQ(ramp.at(0), 4);
  EXPECT_EQ(ramp.at(3), 10);
  EXPECT_EQ(ramp.at(6), 16);
  EXPECT_EQ(ramp.at(100), 16);
  EXPECT_EQ((BatchRamp{0, 8, 0}).at(0), 8);  // no ramp
}

}  // namespace
}  // namespace lt
