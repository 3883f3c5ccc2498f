#include "moe/stats.h"

#include <algorithm>
#include <cmath>

#include "autograd/profile.h"
#include "tensor/kernels.h"

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
  s.tokens_per_expert = routing.counts_E;
  s.routing_entropy = Tensor::empty({1}, DType::F64, routing.probs.device());
  s.max_logit = Tensor::empty({1}, DType::F64, routing.probs.device());
  kernels::routing_entropy(routing.probs, routing.logits, routing.lse, s.routing_entropy, s.max_logit);
  s.balance = routing.balance;
  s.z = routing.z;
  return s;
}

ExpertStats expert_stats(const Routing& routing, const DispatchPlan& plan) {
  ExpertStats s = expert_stats(routing);
  const int64_t E = plan.host_offsets.numel() - 1;
  const int64_t* offsets = plan.host_offsets.data<int64_t>();
  s.tokens_per_expert = Tensor::empty({E}, DType::I64);
  int64_t* load = s.tokens_per_expert.data<int64_t>();
  for (int64_t e = 0; e < E; ++e) load[e] = offsets[e + 1] - offsets[e];
  return s;
}

}  // namespace lt
