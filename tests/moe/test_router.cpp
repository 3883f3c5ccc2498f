// The fused router's statistics against their definitions computed directly from its probabilities:
// expert counts, the load-balance and z losses, and the routing entropy of expert_stats.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/ops.h"
#include "moe/stats.h"
#include "tests/test_util.h"

namespace lt {
namespace {

TEST(Router, StatisticsMatchTheirDefinitions) {
  const int64_t N = 37, H = 6, E = 8, k = 3;
  const Variable x(test::random_tensor({N, H}, 41, DType::F64), true);
  const Variable gate(test::random_tensor({E, H}, 42, DType::F64), true);
  RouterSettings settings;
  settings.top_k = k;
  settings.aux_loss_coef = 0.25;
  settings.z_loss_coef = 0.5;
  Tensor warmup = routing_warmup_stats();
  Rng rng(1);
  const Routing r = route(x, gate, settings, warmup, rng);

  const std::vector<double> p = r.probs.to_vector<double>();
  const std::vector<double> s = matmul(x, gate, false, true).value().to_vector<double>();
  const std::vector<double> counts = r.counts_E.to_vector<double>();
  int64_t assignments = 0;
  for (double c : counts) assignments += static_cast<int64_t>(c);
  EXPECT_EQ(assignments, N * k);
  double balance = 0, z = 0, entropy = 0;
  for (int64_t e = 0; e < E; ++e) {
    double mean_p = 0;
    for (int64_t n = 0; n < N; ++n) mean_p += p[n * E + e] / N;
    balance += E * (counts[e] / (N * k)) * mean_p;
  }
  for (int64_t n = 0; n < N; ++n) {
    double total = 0;
    for (int64_t e = 0; e < E; ++e) total += std::exp(s[n * E + e]);
    z += std::log(total) * std::log(total) / N;
    for (int64_t e = 0; e < E; ++e) entropy -= p[n * E + e] * std::log(p[n * E + e]) / N;
  }
  EXPECT_NEAR(r.balance.item(), balance, 1e-12);
  EXPECT_NEAR(r.z.item(), z, 1e-12);
  EXPECT_NEAR(r.aux_loss.value().item(), 0.25 * balance + 0.5 * z, 1e-12);
  const ExpertStats stats = expert_stats(r);
  EXPECT_NEAR(stats.routing_entropy.item(), entropy, 1e-12);
  EXPECT_EQ(stats.tokens_per_expert.to_vector<double>(), counts);
}

}  // namespace
}  // namespace lt
