// The fused router's statistics against their definitions computed directly from its probabilities:
// expert counts, the load-balance and z losses, and the routing entropy of expert_stats.
#include <gtest/gtest.h>

#include <cmath>

#include "autograd/ops.h"
#include "moe/stats.h"
#include "tests/test_util.h"

namespace lt {
namespace {

// A token's warmup noise depends on where it is in the step's global batch, not on which rows a call
// routes: six sequences in one call equal two calls of three (ranks, micro-batches); the step and the
// layer change it; the values are standard normals.
TEST(Router, WarmupNoiseIsAFunctionOfEachTokensPlace) {
  const int64_t T = 5, E = 4;
  RouterSettings whole;
  whole.noise_seed = 77;
  whole.step = 3;
  whole.layer = 2;
  whole.tokens_per_sequence = T;
  const std::vector<double> all = warmup_noise(whole, 6 * T, E).to_vector<double>();
  RouterSettings second_half = whole;
  second_half.first_sequence = 3;
  std::vector<double> halves = warmup_noise(whole, 3 * T, E).to_vector<double>();
  const std::vector<double> later = warmup_noise(second_half, 3 * T, E).to_vector<double>();
  halves.insert(halves.end(), later.begin(), later.end());
  EXPECT_EQ(halves, all);
  for (auto change : {+[](RouterSettings& s) { ++s.step; }, +[](RouterSettings& s) { ++s.layer; },
                      +[](RouterSettings& s) { ++s.noise_seed; }}) {
    RouterSettings other = whole;
    change(other);
    const std::vector<double> moved = warmup_noise(other, 6 * T, E).to_vector<double>();
    int same = 0;
    for (size_t i = 0; i < all.size(); ++i) same += moved[i] == all[i] ? 1 : 0;
    EXPECT_EQ(same, 0);
  }
  RouterSettings many = whole;
  many.tokens_per_sequence = 64;
  const std::vector<double> draws = warmup_noise(many, 64 * 40, 16).to_vector<double>();
  double mean = 0, square = 0;
  for (double v : draws) mean += v / static_cast<double>(draws.size());
  for (double v : draws) square += (v - mean) * (v - mean) / static_cast<double>(draws.size());
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(square, 1.0, 0.03);
}

TEST(Router, StatisticsMatchTheirDefinitions) {
  const int64_t N = 37, H = 6, E = 8, k = 3;
  const Variable x(test::random_tensor({N, H}, 41, DType::F64), true);
  const Variable gate(test::random_tensor({E, H}, 42, DType::F64), true);
  RouterSettings settings;
  settings.top_k = k;
  settings.aux_loss_coef = 0.25;
  settings.z_loss_coef = 0.5;
  Tensor warmup = routing_warmup_stats();
  const Routing r = route(x, gate, settings, warmup, nullptr);

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
