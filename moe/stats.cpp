#include "moe/stats.h"

#include <algorithm>
#include <cmath>

#include "autograd/profile.h"

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

ExpertStats expert_stats(const Routing& routing) {
  LT_PROFILE_SCOPE("expert_stats");
  ExpertStats s;
  s.tokens_per_expert = routing.expert_counts;
  s.load = summarize_load(s.tokens_per_expert);
  // Per token, -sum_e p_e log p_e = lse - sum_e p_e s_e (log p_e = s_e - lse): one dot product per row,
  // read in place and summed in f64, instead of E logarithms.
  const int64_t N = routing.probs.dim(0), E = routing.probs.dim(1);
  auto entropy_and_max = [&](const auto* p, const auto* logits, const auto* lse) {
    double entropy = 0;
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(p[n * E + e]) * logits[n * E + e];
      entropy += static_cast<double>(lse[n]) - dot;
    }
    s.routing_entropy = N > 0 ? entropy / static_cast<double>(N) : 0;
    s.max_logit = N * E > 0 ? static_cast<double>(*std::max_element(logits, logits + N * E)) : 0;
  };
  if (routing.probs.dtype() == DType::F32)
    entropy_and_max(routing.probs.data<float>(), routing.logits.data<float>(), routing.lse.data<float>());
  else
    entropy_and_max(routing.probs.data<double>(), routing.logits.data<double>(), routing.lse.data<double>());
  s.balance = routing.balance;
  s.z = routing.z;
  return s;
}

}  // namespace lt
