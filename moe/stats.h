// Per-layer router statistics for the metrics log (spec/ling.md §16), computed over the tokens of one
// forward (a micro-batch); the trainer sums the loads of its micro-batches and summarises them again.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/router.h"

namespace lt {

struct LoadSummary {
  double max_over_mean = 0;  // max load / mean load (1 = perfect balance); MaxVio = this - 1
  int64_t min_load = 0;
  int64_t dead_experts = 0;  // experts that received no token
  double load_cv = 0;        // std / mean of the load
};
LoadSummary summarize_load(const std::vector<int64_t>& tokens_per_expert);

struct ExpertStats {
  std::vector<int64_t> tokens_per_expert;  // assignments per expert (sum = N k)
  LoadSummary load;
  double routing_entropy = 0;  // mean over tokens of -sum_e p log p (nats; max log E)
  double balance = 0;          // unscaled load-balance loss (1 at perfect balance)
  double z = 0;                // unscaled z-loss
  double max_logit = 0;
};

ExpertStats expert_stats(const Routing& routing);

}  // namespace lt
