#include "moe/stats.h"

#include <algorithm>
#include <cmath>

namespace lt {

LoadSummary summarize_load(const std::vector<int64_t>& load) {
  LoadSummary s;
  if (load.empty()) return s;
  const double E = static_cast<double>(load.size());
  double total = 0;
  for (int64_t c : load) total += static_cast<double>(c);
  const double mean = total / E;
  s.min_load = *std::min_element(load.begin(), load.end());
  s.dead_experts = std::count(load.begin(), load.end(), 0);
  s.max_over_mean = mean > 0 ? static_cast<double>(*std::max_element(load.begin(), load.end())) / mean : 0;
  double var = 0;
  for (int64_t c : load) var += (static_cast<double>(c) - mean) * (static_cast<double>(c) - mean);
  s.load_cv = mean > 0 ? std::sqrt(var / E) / mean : 0;
  return s;
}

ExpertStats expert_stats(const Routing& routing, double balance_value, double z_value) {
  ExpertStats s;
  s.tokens_per_expert = routing.expert_counts;
  s.load = summarize_load(s.tokens_per_expert);
  const std::vector<double> probs = routing.probs.value().to(DType::F64).to_vector<double>();
  const int64_t N = routing.probs.dim(0);
  double entropy = 0;
  for (double p : probs)
    if (p > 0) entropy -= p * std::log(p);
  s.routing_entropy = N > 0 ? entropy / static_cast<double>(N) : 0;
  const std::vector<double> logits = routing.logits.value().to(DType::F64).to_vector<double>();
  s.max_logit = logits.empty() ? 0 : *std::max_element(logits.begin(), logits.end());
  s.balance = balance_value;
  s.z = z_value;
  return s;
}

}  // namespace lt
