// Per-layer router statistics for the metrics log (docs/architecture.md §7.5), computed over the
// tokens of one forward (a micro-batch); the trainer sums the loads of its micro-batches and
// summarises them on the host with summarize_load when it logs.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/dispatch.h"
#include "moe/router.h"

namespace lt {

struct LoadSummary {
  double max_over_mean = 0;  // max load / mean load (1 = perfect balance); MaxVio = this - 1
  int64_t min_load = 0;
  int64_t dead_experts = 0;  // experts that received no token
  double load_cv = 0;        // std / mean of the load
};
LoadSummary summarize_load(const std::vector<int64_t>& tokens_per_expert);

// On the routing's device, so that collecting them costs the step no wait; the trainer reads them when
// it logs. The load is already on the host where a dispatch plan gave it.
struct ExpertStats {
  Tensor tokens_per_expert;  // [E] assignments per expert (sum = N k): the routing's counts_E, or i64 on
                             // the CPU from a plan's host offsets
  Tensor routing_entropy;    // f64 [1]: mean over tokens of -sum_e p log p (nats; max log E)
  Tensor balance;            // f64 [1]: unscaled load-balance loss (1 at perfect balance)
  Tensor z;                  // f64 [1]: unscaled z-loss
  Tensor max_logit;          // f64 [1]
};

ExpertStats expert_stats(const Routing& routing);
// The same, with the load taken from the plan of that routing's dispatch (its host offsets, already
// copied once for the grouped GEMMs): the step reads no more of the device for it.
ExpertStats expert_stats(const Routing& routing, const DispatchPlan& plan);

}  // namespace lt
