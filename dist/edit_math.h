// The arithmetic of an EDiT synchronisation (docs/architecture.md §11), one piece per concept, each
// checked against hand computations; the synchronisation itself (layer by layer over the sync group)
// builds on these.
//
// For one layer on worker m: the pseudo-gradient Delta_m = anchor - current and its norm G_m; an
// anomaly detector per layer drops outlying norms (Delta_m := 0); the workers' pseudo-gradients are
// averaged with weights softmax(-G / T) (smaller steps count more); the average is clipped to a norm
// phi; the outer optimizer (SGD with Nesterov momentum, or plain averaging) moves the anchor by it.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "io/json.h"
#include "tensor/tensor.h"

namespace lt {

// One-sided online anomaly detector over a stream of norms: an exponentially weighted mean and variance
// (weight alpha), z-scores against them, and a threshold that widens with the spread of the recent
// z-scores. Only large values are anomalies, and none during the first warmup_steps updates.
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
  // Adds x to the statistics. The caller passes the norm it measured, outlier or not: the reference
  // code feeds an outlier's inflated value (norm + 1e6, its way of zeroing the softmax weight) into the
  // statistics, which would blow the mean up for ~1/alpha updates; lingtrain keeps the measured value.
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

// Weights of the workers' pseudo-gradients: softmax over workers of -norm / temperature, computed
// from the smallest norm so no exponential overflows. A worker whose pseudo-gradient was dropped as
// an anomaly passes dropped = true and gets weight 0 (the reference adds 1e6 to its norm for this).
// All dropped: all weights 0.
std::vector<double> pseudo_gradient_weights(const std::vector<double>& norms, const std::vector<bool>& dropped,
                                            double temperature);

// The factor that clips a vector of norm `norm` to at most `max_norm` (1 when max_norm <= 0: no clip),
// with the 1e-6 of gradient clipping.
double clip_factor(double norm, double max_norm);

// The outer optimizer on the anchor: SGD with (Nesterov) momentum as PyTorch's torch.optim.SGD, the
// pseudo-gradient as the gradient: buf = momentum buf + g (buf = g on the first step);
// step = g + momentum buf (Nesterov) or buf; anchor -= lr step. momentum 0 and lr 1 is plain averaging.
struct OuterSgd {
  double lr = 0.7, momentum = 0.8;
  bool nesterov = true;
  // anchor, grad and momentum_buffer: one shape and float dtype; first: the buffer holds nothing yet.
  void step(Tensor& anchor, const Tensor& grad, Tensor& momentum_buffer, bool first) const;
};

}  // namespace lt
