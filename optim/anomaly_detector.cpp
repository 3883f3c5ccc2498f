#include "optim/anomaly_detector.h"

#include <algorithm>
#include <cmath>

#include "tensor/error.h"

namespace lt {

double AnomalyDetector::std() const { return count_ < 2 ? 0.0 : std::sqrt(m2_); }

double AnomalyDetector::z_score(double x) const {
  const double s = std();
  if (s == 0 || count_ < settings_.warmup_steps) return 0;
  return (x - mean_) / s;
}

double AnomalyDetector::dynamic_threshold() const {
  if (count_ < settings_.warmup_steps || recent_z_.size() < 2) return settings_.threshold;
  double sum = 0, sum_sq = 0;
  for (double z : recent_z_) sum += z;
  const double n = static_cast<double>(recent_z_.size()), mean = sum / n;
  for (double z : recent_z_) sum_sq += (z - mean) * (z - mean);
  return settings_.threshold * std::max(1.0, std::sqrt(sum_sq / n));
}

bool AnomalyDetector::is_outlier(double x) const {
  return count_ >= settings_.warmup_steps && z_score(x) > dynamic_threshold();
}

void AnomalyDetector::update(double x) {
  ++count_;
  const double d = x - mean_;
  mean_ += settings_.alpha * d;
  const double d2 = x - mean_;
  m2_ = (1 - settings_.alpha) * (m2_ + settings_.alpha * d * d2);
  recent_z_.push_back(z_score(x));
  while (static_cast<int64_t>(recent_z_.size()) > std::max<int64_t>(settings_.warmup_steps, 1)) recent_z_.pop_front();
}

Json AnomalyDetector::to_json() const {
  return Json{{"mean", mean_}, {"m2", m2_}, {"count", count_},
              {"recent_z", std::vector<double>(recent_z_.begin(), recent_z_.end())}};
}

AnomalyDetector AnomalyDetector::from_json(const Json& json, Settings settings, const std::string& source) {
  AnomalyDetector d(settings);
  const JsonObject o(json, source);
  d.mean_ = o.get<double>("mean");
  d.m2_ = o.get<double>("m2");
  d.count_ = o.get<int64_t>("count");
  LT_CHECK(d.count_ >= 0 && d.m2_ >= 0, source, ": anomaly detector state out of range");
  try {
    const std::vector<double> z = json.at("recent_z").get<std::vector<double>>();
    d.recent_z_.assign(z.begin(), z.end());
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": malformed anomaly detector window (", e.what(), ")");
  }
  return d;
}

}  // namespace lt
