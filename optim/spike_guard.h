// The loss-spike guard (docs/reliability.md; the Ling report's §3.4.4 practice): every step is judged
// after its backward and before its update, against online estimates of the loss and the gradient norm
// (two one-sided EWMA detectors, optim/anomaly_detector.h).
//
//   a spike (loss or gradient norm an outlier)  the update is not applied; the batch is set aside and
//                                               the step retried on the next batch, up to max_retries
//                                               times; then the step is accepted (a lasting shift, not a
//                                               bad batch) and the detectors learn the new level
//   spikes_to_cut spikes within cut_window      the learning rate is multiplied by lr_cut for the next
//   steps                                       cooldown_steps steps
//   a non-finite loss or gradient norm          never applied; retried on the next batch, and after
//                                               bad_steps_to_reload such steps in a row the run reloads
//                                               its last checkpoint, keeps its data position (the window
//                                               that caused it is skipped) and multiplies the learning
//                                               rate by lr_cut for good; after max_reloads it stops
//
// The guard sees one loss and one gradient norm per step; under data parallel they are averaged across
// the ranks first, so every rank decides the same.
#pragma once
#include <cstdint>
#include <deque>
#include <string>

#include "io/json.h"
#include "optim/anomaly_detector.h"

namespace lt {

struct SpikeGuardSettings {
  bool enabled = true;
  // Loss curves fall fast early on, so the detectors judge only after a warmup, and at a threshold
  // well above the EDiT detector's (a z of 6 on the loss is far outside a training run's noise).
  AnomalyDetector::Settings detector{/*alpha=*/0.02, /*warmup_steps=*/50, /*threshold=*/6.0};
  int64_t max_retries = 3;
  int64_t spikes_to_cut = 2;
  int64_t cut_window = 100;
  double lr_cut = 0.5;
  int64_t cooldown_steps = 200;
  int64_t bad_steps_to_reload = 3;
  int64_t max_reloads = 3;

  void validate() const;
  Json to_json() const;
};

class SpikeGuard {
 public:
  enum class Action { Apply, Retry, Accept, Reload };
  struct Verdict {
    Action action = Action::Apply;
    std::string kind;  // "" (no spike), "loss", "grad_norm", "nonfinite"
    double z = 0;      // the larger z-score of the two detectors (0 for non-finite steps)
  };

  explicit SpikeGuard(SpikeGuardSettings settings);

  // The verdict on step `step` (optimiser steps taken before it) with this loss and gradient norm.
  // Apply and Accept update the parameters; Retry and Reload do not (Reload: the caller reloads the last
  // checkpoint and calls reloaded()).
  Verdict judge(int64_t step, double loss, double grad_norm);
  // The caller reloaded the last checkpoint after a Reload verdict: the learning rate is cut for good.
  // Fails with one clear line once max_reloads reloads have not helped.
  void reloaded();
  // The factor on the scheduled learning rate at step `step`.
  double lr_factor(int64_t step) const;

  static const char* action_name(Action action);
  int64_t reloads() const { return reloads_; }
  Json to_json() const;  // exact: a resumed run judges as the uninterrupted one
  void load(const Json& json, const std::string& source);

 private:
  SpikeGuardSettings settings_;
  AnomalyDetector loss_, grad_norm_;
  int64_t retries_ = 0;         // of the step being retried
  int64_t bad_in_a_row_ = 0;    // non-finite steps in a row
  int64_t reloads_ = 0;
  int64_t cooldown_until_ = 0;  // the lr is cut for steps below this
  double reload_factor_ = 1.0;  // lr_cut^reloads
  std::deque<int64_t> recent_spikes_;  // steps of the spikes within the last cut_window steps
};

}  // namespace lt
