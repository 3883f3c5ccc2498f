// A one-sided online anomaly detector over a stream of values (the EWMA detector of EDiT's reference
// implementation, spec/ling.md §13.4). It judges pseudo-gradient norms per layer in EDiT's sync
// (dist/edit.h) and losses and gradient norms in the spike guard (optim/spike_guard.h).
#pragma once
#include <cstdint>
#include <deque>
#include <string>

#include "io/json.h"

namespace lt {

// An exponentially weighted mean and variance (weight alpha), z-scores against them, and a threshold
// that widens with the spread of the recent z-scores. Only large values are anomalies, and none during
// the first warmup_steps updates.
class AnomalyDetector {
 public:
  struct Settings {
    double alpha = 0.02;         // EWMA weight of a new value
    int64_t warmup_steps = 120;  // updates before anything can be an outlier; also the z-score window
    double threshold = 3;        // base threshold on the z-score
  };
  explicit AnomalyDetector(Settings settings) : settings_(settings) {}

  double std() const;
  // (x - mean) / std, 0 while the detector is warming up or the spread is 0.
  double z_score(double x) const;
  // threshold * max(1, standard deviation of the recent z-scores); the base threshold in warmup.
  double dynamic_threshold() const;
  bool is_outlier(double x) const;
  // Adds x to the statistics. The caller passes the value it measured, outlier or not (EDiT's reference
  // code feeds an outlier's inflated norm, norm + 1e6, into the statistics, which would blow the mean
  // up for ~1/alpha updates; lingtrain keeps the measured value).
  void update(double x);

  int64_t count() const { return count_; }
  double mean() const { return mean_; }
  Json to_json() const;  // exact (17 digits), for checkpoints
  static AnomalyDetector from_json(const Json& json, Settings settings, const std::string& source);

 private:
  Settings settings_;
  double mean_ = 0, m2_ = 0;
  int64_t count_ = 0;
  std::deque<double> recent_z_;  // the last warmup_steps z-scores
};

}  // namespace lt
