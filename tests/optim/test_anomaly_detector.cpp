// The one-sided EWMA anomaly detector against numbers worked out by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/anomaly_detector.h"

namespace lt {
namespace {

TEST(AnomalyDetector, HandComputedStatisticsAndOneSidedOutliers) {
  AnomalyDetector d({/*alpha=*/0.5, /*warmup_steps=*/2, /*threshold=*/1.0});
  EXPECT_FALSE(d.is_outlier(1e9)) << "nothing is an outlier during warmup";
  d.update(2);  // d = 2, mean 1, d2 = 1, M2 = 0.5 (0 + 0.5 * 2 * 1) = 0.5
  EXPECT_DOUBLE_EQ(d.mean(), 1.0);
  EXPECT_EQ(d.std(), 0.0);  // one value: no spread yet
  d.update(4);  // d = 3, mean 2.5, d2 = 1.5, M2 = 0.5 (0.5 + 0.5 * 3 * 1.5) = 1.375
  EXPECT_DOUBLE_EQ(d.mean(), 2.5);
  EXPECT_DOUBLE_EQ(d.std(), std::sqrt(1.375));
  // Recent z-scores [0, (4 - 2.5) / sqrt(1.375) = 1.279]: their spread 0.640 < 1, so the threshold is 1.
  EXPECT_DOUBLE_EQ(d.dynamic_threshold(), 1.0);
  EXPECT_NEAR(d.z_score(6), 3.5 / std::sqrt(1.375), 1e-15);
  EXPECT_TRUE(d.is_outlier(6));    // z 2.98
  EXPECT_FALSE(d.is_outlier(3));   // z 0.43
  EXPECT_FALSE(d.is_outlier(-50)); // far below: one-sided
  const AnomalyDetector back = AnomalyDetector::from_json(parse_json(d.to_json().dump(), "d"), {0.5, 2, 1.0}, "d");
  EXPECT_EQ(back.mean(), d.mean());
  EXPECT_EQ(back.std(), d.std());
  EXPECT_EQ(back.dynamic_threshold(), d.dynamic_threshold());
  EXPECT_EQ(back.count(), 2);
}

}  // namespace
}  // namespace lt
