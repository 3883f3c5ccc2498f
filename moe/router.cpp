#include "moe/router.h"

#include <cmath>

#include "autograd/ops.h"
#include "moe/ops.h"

namespace lt {

void RoutingWarmup::observe(const Tensor& logits) {
  const std::vector<double> values = logits.to(DType::F64).to_vector<double>();
  if (values.empty()) return;
  double sum = 0, sum_sq = 0;
  for (double v : values) sum += v;
  const double batch_mean = sum / static_cast<double>(values.size());
  for (double v : values) sum_sq += (v - batch_mean) * (v - batch_mean);
  const double batch_std = std::sqrt(sum_sq / static_cast<double>(values.size()));
  if (!initialized) {
    mean = batch_mean;
    std = batch_std;
    initialized = true;
    return;
  }
  mean = kMomentum * mean + (1 - kMomentum) * batch_mean;
  std = kMomentum * std + (1 - kMomentum) * batch_std;
}

Routing route(const Variable& x_NH, const Variable& gate_EH, const RouterSettings& settings, RoutingWarmup& warmup,
              Rng& rng) {
  Routing r;
  Variable logits = matmul(x_NH, gate_EH, false, true);  // [N, E]
  const int64_t N = logits.dim(0), E = logits.dim(1);
  const bool warming = settings.training && settings.warmup_steps > 0 && settings.step < settings.warmup_steps;
  if (warming) {
    if (settings.update_warmup_stats) warmup.observe(logits.value());
    const double alpha = static_cast<double>(settings.step) / static_cast<double>(settings.warmup_steps);
    // (1 - alpha)(mu + sigma eps), drawn in element order from the trainer's generator.
    std::vector<double> noise(static_cast<size_t>(N * E));
    for (double& v : noise) v = (1 - alpha) * (warmup.mean + warmup.std * rng.normal());
    const Tensor mixed_noise =
        Tensor::from_vector<double>({N, E}, noise).to(logits.value().dtype()).to(logits.value().device());
    logits = add(scale(logits, alpha), Variable(mixed_noise));
  }
  r.logits = logits;
  r.probs = softmax(logits);
  TopK top = topk(r.probs, settings.top_k);
  r.expert_ids = top.indices;
  r.weights = settings.norm_topk_prob && settings.top_k > 1 ? normalize_rows(top.values) : top.values;
  r.expert_counts.assign(static_cast<size_t>(E), 0);
  for (int32_t e : top.indices.to_vector<int32_t>()) ++r.expert_counts[static_cast<size_t>(e)];
  return r;
}

}  // namespace lt
