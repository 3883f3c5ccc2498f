// Expert parallelism across real ranks: the token exchange (dist/expert_exchange.h) delivers each rank's
// rows to the rank of their expert laid out expert by expert (each expert's rows in source-rank order),
// brings them back bit for bit, and its autograd ops send gradients back the other way (each is the
// other's adjoint); the experts' output through it (moe/expert_parallel.h) equals every rank holding all
// the experts. Counts differ by rank and by expert, zeros included (an expert no rank routes to, a rank
// that sends another nothing).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "autograd/ops.h"
#include "dist/expert_exchange.h"
#include "moe/dispatch.h"
#include "moe/expert_parallel.h"
#include "moe/ops.h"
#include "tensor/random.h"
#include "model/config.h"
#include "tests/mpi/mpi_world.h"
#include "tests/test_util.h"
#include "trainer/plan.h"

namespace lt {
namespace {

using mpi_test::world;

constexpr int64_t kH = 3;

// Rank s's rows for expert e: a count that depends on both (expert 1 has none anywhere; rank 1 sends rank
// 0's experts nothing when there are two experts a rank), and values that name rank, expert, row, column.
int64_t rows_for(int s, int64_t e) { return e == 1 || (s == 1 && e < 2) ? 0 : (s + 2 * e) % 4 + 1; }
double value_of(int s, int64_t e, int64_t k, int64_t c) { return 1000.0 * s + 100.0 * e + 10.0 * k + c; }

// Rank s's rows, sorted by expert, and its counts.
std::pair<Tensor, std::vector<int64_t>> rows_of(int s, int64_t E) {
  std::vector<int64_t> counts;
  std::vector<double> values;
  for (int64_t e = 0; e < E; ++e) {
    counts.push_back(rows_for(s, e));
    for (int64_t k = 0; k < rows_for(s, e); ++k)
      for (int64_t c = 0; c < kH; ++c) values.push_back(value_of(s, e, k, c));
  }
  const auto M = static_cast<int64_t>(values.size()) / kH;
  return {Tensor::from_vector<double>({M, kH}, values), counts};
}

TEST(ExpertExchange, RowsReachTheirExpertsRankAndComeBack) {
  const int G = world->size(), r = world->rank();
  for (const int64_t L : {int64_t{1}, int64_t{2}}) {
    const int64_t E = G * L;
    const auto [rows, counts] = rows_of(r, E);
    const ExpertExchange exchange(*world, counts);
    ASSERT_EQ(exchange.experts_per_rank(), L);
    // Expert by expert, each expert's rows in source-rank order.
    std::vector<double> expected;
    std::vector<int64_t> offsets = {0};
    for (int64_t j = 0; j < L; ++j) {
      const int64_t e = r * L + j;
      for (int s = 0; s < G; ++s)
        for (int64_t k = 0; k < rows_for(s, e); ++k)
          for (int64_t c = 0; c < kH; ++c) expected.push_back(value_of(s, e, k, c));
      offsets.push_back(static_cast<int64_t>(expected.size()) / kH);
    }
    const Tensor at_experts = exchange.to_experts(rows);
    EXPECT_EQ(at_experts.to_vector<double>(), expected) << "L = " << L;
    EXPECT_EQ(exchange.local_offsets(), offsets) << "L = " << L;
    EXPECT_EQ(exchange.rows_received(), offsets.back());
    EXPECT_EQ(exchange.from_experts(at_experts).to_vector<double>(), rows.to_vector<double>()) << "L = " << L;
  }
}

// <to_experts(x), y> = <x, from_experts(y)> summed over the ranks, and autograd runs each op backward as the
// other: the gradient of sum(to_experts(x) * y) with respect to x is from_experts(y), and the reverse.
TEST(ExpertExchange, EachDirectionIsTheOthersGradient) {
  const int G = world->size(), r = world->rank();
  const int64_t E = 2 * G;
  const auto [rows, counts] = rows_of(r, E);
  const auto exchange = std::make_shared<const ExpertExchange>(*world, counts);
  const int64_t R = exchange->rows_received();
  std::vector<double> weights(static_cast<size_t>(R * kH));
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.5 + static_cast<double>((i * 7 + r) % 11);
  const Tensor y = Tensor::from_vector<double>({R, kH}, weights);

  Variable x(rows, true);
  const Variable sent = exchange_to_experts(x, exchange);
  sum(mul(sent, Variable(y))).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), exchange->from_experts(y).to_vector<double>());

  Variable z(y, true);
  const Variable back = exchange_from_experts(z, exchange);
  sum(mul(back, Variable(rows))).backward();
  EXPECT_EQ(z.grad().to_vector<double>(), exchange->to_experts(rows).to_vector<double>());

  // The adjoint identity across the ranks.
  auto dot = [](const Tensor& a, const Tensor& b) {
    double s = 0;
    const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
    for (size_t i = 0; i < av.size(); ++i) s += av[i] * bv[i];
    return s;
  };
  Tensor both =
      Tensor::from_vector<double>({2}, {dot(exchange->to_experts(rows), y), dot(rows, exchange->from_experts(y))});
  world->all_reduce(both, ReduceOp::Sum);
  const std::vector<double> sums = both.to_vector<double>();
  EXPECT_DOUBLE_EQ(sums[0], sums[1]);
}

// The bytes the exchange sends against `lingtrain plan`'s all-to-all (trainer/plan.h), with every expert
// given the same rows as the plan assumes: one MoE layer's rows to their experts and back, forward and
// backward (the backward is the same two exchanges the other way), are what the plan counts for the
// layer; the counts cross first, E / G integers to each other rank.
TEST(ExpertExchange, BytesSentAreThePlansAllToAll) {
  const int G = world->size();
  LingConfig c = preset_config("tiny");
  c.num_hidden_layers = 1;
  c.first_k_dense_replace = 0;
  c.num_experts = 2 * G;
  c.num_experts_per_tok = 2;
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, H = c.hidden_size, T = E;  // 2 rows per expert
  const std::vector<int64_t> counts(static_cast<size_t>(E), T * k / E);
  const Tensor rows = Tensor::zeros({T * k, H});
  const int64_t before = world->bytes_sent();
  const ExpertExchange exchange(*world, counts);
  const int64_t after_counts = world->bytes_sent();
  exchange.from_experts(exchange.to_experts(rows));
  const int64_t forward = world->bytes_sent() - after_counts;
  EXPECT_EQ(after_counts - before, (E / G) * 8 * (G - 1));

  PlanLayout layout;
  layout.ranks = G;
  layout.expert_parallel = G;
  PlanShape shape;
  shape.seq = T;
  shape.on_gpu = false;
  EXPECT_EQ(2 * forward, plan_training(c, layout, shape).traffic.expert_all_to_all);
}

TEST(ExpertExchange, ExpertsThatDoNotSplitAreOneError) {
  const std::vector<int64_t> counts(static_cast<size_t>(world->size() * 2 + 1), 1);
  EXPECT_THROW(ExpertExchange(*world, counts), Error);
}

// The routed experts split over the ranks against every rank holding all of them, in f64: each rank's
// tokens (its own x, routing and plan) give the same output and the same gradients for x and the routing
// weights as moe_experts with all the experts, and a rank's experts' weight gradients are the sum over the
// ranks of what moe_experts gives each rank's tokens for those experts. Some experts get no rows.
TEST(ExpertExchange, ExpertParallelExpertsEqualAllExpertsOnEveryRank) {
  const int G = world->size(), r = world->rank();
  const int64_t L = 2, E = G * L, k = 2, N = 7 + r, H = 6, I = 4;
  auto random = [](const Shape& shape, uint64_t seed) {
    Rng rng(seed);
    return Tensor::randn(shape, rng, 0.5, DType::F64);
  };
  // The same weights on every rank; this rank's tokens and routing of its own.
  const Tensor gate_up = random({E, 2 * I, H}, 11), down = random({E, H, I}, 12);
  const Tensor x = random({N, H}, 100 + static_cast<uint64_t>(r)), w = random({N, k}, 200 + static_cast<uint64_t>(r));
  const Tensor out_grad = random({N, H}, 300 + static_cast<uint64_t>(r));
  // Experts 1 and E - 1 get no rows anywhere; a token's two slots take two different experts.
  auto expert_of = [&](int64_t n, int64_t slot) {
    const int64_t v = (n * 3 + slot + r) % (E - 2);
    return static_cast<int32_t>(v + (v >= 1 ? 1 : 0));
  };
  std::vector<int32_t> ids;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t slot = 0; slot < k; ++slot) ids.push_back(expert_of(n, slot));
  const DispatchPlan plan = plan_dispatch(Tensor::from_vector<int32_t>({N, k}, ids), E);

  Variable x_all(x, true), w_all(w, true), gate_up_all(gate_up, true), down_all(down, true);
  sum(mul(moe_experts(x_all, w_all, plan, gate_up_all, down_all), Variable(out_grad))).backward();

  Variable x_ep(x, true), w_ep(w, true);
  Variable gate_up_ep(gate_up.narrow(r * L, L).clone(), true), down_ep(down.narrow(r * L, L).clone(), true);
  ExpertCommunicatorGroup group(*world);
  const Variable out_ep = expert_parallel_experts(x_ep, w_ep, plan, gate_up_ep, down_ep, group);
  sum(mul(out_ep, Variable(out_grad))).backward();

  const Tensor out_all = moe_experts(Variable(x), Variable(w), plan, Variable(gate_up), Variable(down)).value();
  test::expect_close(out_ep.value().to_vector<double>(), out_all.to_vector<double>(), 1e-12, 1e-12, "output");
  test::expect_close(x_ep.grad().to_vector<double>(), x_all.grad().to_vector<double>(), 1e-12, 1e-12, "dx");
  test::expect_close(w_ep.grad().to_vector<double>(), w_all.grad().to_vector<double>(), 1e-12, 1e-12, "dw");
  // Every rank's gradients of all the experts, summed; this rank's slice of them.
  Tensor dgate_up = gate_up_all.grad().clone(), ddown = down_all.grad().clone();
  world->all_reduce(dgate_up, ReduceOp::Sum);
  world->all_reduce(ddown, ReduceOp::Sum);
  test::expect_close(gate_up_ep.grad().to_vector<double>(), dgate_up.narrow(r * L, L).to_vector<double>(), 1e-12, 1e-12,
               "dgate_up");
  test::expect_close(down_ep.grad().to_vector<double>(), ddown.narrow(r * L, L).to_vector<double>(), 1e-12, 1e-12,
                     "ddown");
}

}  // namespace
}  // namespace lt
