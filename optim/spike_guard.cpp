#include "optim/spike_guard.h"

#include <algorithm>
#include <cmath>

#include "tensor/error.h"

namespace lt {

void SpikeGuardSettings::validate() const {
  LT_CHECK(detector.alpha > 0 && detector.alpha <= 1, "--spike-alpha must be in (0, 1], got ", detector.alpha);
  LT_CHECK(detector.warmup_steps >= 0, "--spike-warmup must be >= 0, got ", detector.warmup_steps);
  LT_CHECK(detector.threshold > 0, "--spike-threshold must be > 0, got ", detector.threshold);
  LT_CHECK(max_retries >= 0, "--spike-retries must be >= 0, got ", max_retries);
  LT_CHECK(lr_cut > 0 && lr_cut <= 1, "--spike-lr-cut must be in (0, 1], got ", lr_cut);
  LT_CHECK(spikes_to_cut >= 1 && cut_window >= 1 && cooldown_steps >= 0,
           "the spike guard needs --spike-cut-after >= 1, a window >= 1 and --spike-cooldown >= 0");
  LT_CHECK(bad_steps_to_reload >= 1, "--nan-reload-after must be >= 1, got ", bad_steps_to_reload);
  LT_CHECK(max_reloads >= 0, "--max-reloads must be >= 0, got ", max_reloads);
}

Json SpikeGuardSettings::to_json() const {
  return Json{{"enabled", enabled},
              {"alpha", detector.alpha},
              {"warmup_steps", detector.warmup_steps},
              {"threshold", detector.threshold},
              {"max_retries", max_retries},
              {"spikes_to_cut", spikes_to_cut},
              {"cut_window", cut_window},
              {"lr_cut", lr_cut},
              {"cooldown_steps", cooldown_steps},
              {"bad_steps_to_reload", bad_steps_to_reload},
              {"max_reloads", max_reloads}};
}

SpikeGuard::SpikeGuard(SpikeGuardSettings settings)
    : settings_(settings), loss_(settings.detector), grad_norm_(settings.detector) {
  settings_.validate();
}

SpikeGuard::Verdict SpikeGuard::judge(int64_t step, double loss, double grad_norm) {
  Verdict v;
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    // Non-finite values never reach the weights, guard or no guard, and never reach the detectors.
    v.kind = "nonfinite";
    ++bad_in_a_row_;
    v.action = bad_in_a_row_ >= settings_.bad_steps_to_reload ? Action::Reload : Action::Retry;
    return v;
  }
  bad_in_a_row_ = 0;
  if (!settings_.enabled) return v;
  const bool loss_spike = loss_.is_outlier(loss), norm_spike = grad_norm_.is_outlier(grad_norm);
  v.z = std::max(loss_.z_score(loss), grad_norm_.z_score(grad_norm));
  if (loss_spike || norm_spike) {
    v.kind = loss_spike ? "loss" : "grad_norm";
    while (!recent_spikes_.empty() && recent_spikes_.front() <= step - settings_.cut_window) recent_spikes_.pop_front();
    recent_spikes_.push_back(step);
    if (static_cast<int64_t>(recent_spikes_.size()) >= settings_.spikes_to_cut)
      cooldown_until_ = std::max(cooldown_until_, step + settings_.cooldown_steps);
    if (retries_ < settings_.max_retries) {
      ++retries_;
      v.action = Action::Retry;
      return v;  // the detectors do not learn a value that was set aside
    }
    v.action = Action::Accept;
  }
  retries_ = 0;
  loss_.update(loss);
  grad_norm_.update(grad_norm);
  return v;
}

void SpikeGuard::reloaded() {
  ++reloads_;
  LT_CHECK(reloads_ <= settings_.max_reloads, "the run diverged: ", settings_.bad_steps_to_reload,
           " non-finite steps in a row after ", settings_.max_reloads,
           " reloads of the last checkpoint at ever lower learning rates; lower --lr and resume from the checkpoint");
  bad_in_a_row_ = 0;
  retries_ = 0;
  reload_factor_ *= settings_.lr_cut;
}

double SpikeGuard::lr_factor(int64_t step) const {
  return reload_factor_ * (step < cooldown_until_ ? settings_.lr_cut : 1.0);
}

const char* SpikeGuard::action_name(Action action) {
  switch (action) {
    case Action::Apply: return "apply";
    case Action::Retry: return "retry";
    case Action::Accept: return "accept";
    case Action::Reload: return "reload";
  }
  return "?";
}

Json SpikeGuard::to_json() const {
  return Json{{"loss", loss_.to_json()},
              {"grad_norm", grad_norm_.to_json()},
              {"retries", retries_},
              {"bad_in_a_row", bad_in_a_row_},
              {"reloads", reloads_},
              {"cooldown_until", cooldown_until_},
              {"reload_factor", reload_factor_},
              {"recent_spikes", std::vector<int64_t>(recent_spikes_.begin(), recent_spikes_.end())}};
}

void SpikeGuard::load(const Json& json, const std::string& source) {
  const JsonObject o(json, source, "spike_guard");
  loss_ = AnomalyDetector::from_json(o.object("loss").json(), settings_.detector, source);
  grad_norm_ = AnomalyDetector::from_json(o.object("grad_norm").json(), settings_.detector, source);
  retries_ = o.get<int64_t>("retries");
  bad_in_a_row_ = o.get<int64_t>("bad_in_a_row");
  reloads_ = o.get<int64_t>("reloads");
  cooldown_until_ = o.get<int64_t>("cooldown_until");
  reload_factor_ = o.get<double>("reload_factor");
  LT_CHECK(retries_ >= 0 && bad_in_a_row_ >= 0 && reloads_ >= 0 && reload_factor_ > 0 && reload_factor_ <= 1, source,
           ": spike guard state out of range");
  try {
    const std::vector<int64_t> spikes = json.at("recent_spikes").get<std::vector<int64_t>>();
    recent_spikes_.assign(spikes.begin(), spikes.end());
  } catch (const nlohmann::json::exception& e) {
    fail(source, ": malformed spike guard state (", e.what(), ")");
  }
}

}  // namespace lt
