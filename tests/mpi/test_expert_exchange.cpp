// Expert parallelism across real ranks: the token exchange (dist/expert_exchange.h) delivers each rank's
// rows to the rank of their expert source by source, brings them back bit for bit, and each direction is
// the other's adjoint; the experts' output through it (moe/expert_parallel.h) has the bits of one process
// holding all the experts. Counts differ by rank and by expert, zeros included (an expert no rank routes to, a rank
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
    // Source by source, each source's rows in its expert order.
    std::vector<double> expected;
    std::vector<int64_t> counts_from;
    for (int s = 0; s < G; ++s)
      for (int64_t j = 0; j < L; ++j) {
        const int64_t e = r * L + j;
        counts_from.push_back(rows_for(s, e));
        for (int64_t k = 0; k < rows_for(s, e); ++k)
          for (int64_t c = 0; c < kH; ++c) expected.push_back(value_of(s, e, k, c));
      }
    const Tensor at_experts = exchange.to_experts(rows);
    EXPECT_EQ(at_experts.to_vector<double>(), expected) << "L = " << L;
    EXPECT_EQ(exchange.counts_from_ranks(), counts_from) << "L = " << L;
    EXPECT_EQ(exchange.rows_received(), static_cast<int64_t>(expected.size()) / kH);
    EXPECT_EQ(exchange.from_experts(at_experts).to_vector<double>(), rows.to_vector<double>()) << "L = " << L;
  }
}

// <to_experts(x), y> = <x, from_experts(y)> summed over the ranks: each direction is the other's adjoint,
// which is what lets the experts' backward send gradients home the way the forward sent rows.
TEST(ExpertExchange, EachDirectionIsTheOthersAdjoint) {
  const int G = world->size(), r = world->rank();
  const int64_t E = 2 * G;
  const auto [rows, counts] = rows_of(r, E);
  const auto exchange = std::make_shared<const ExpertExchange>(*world, counts);
  const int64_t R = exchange->rows_received();
  std::vector<double> weights(static_cast<size_t>(R * kH));
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.5 + static_cast<double>((i * 7 + r) % 11);
  const Tensor y = Tensor::from_vector<double>({R, kH}, weights);
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

// The bytes the experts' exchanges send against `lingtrain plan`'s all-to-all (trainer/plan.h), with every
// expert given the same rows as the plan assumes: one MoE layer's forward and backward through
// expert_parallel_experts (the counts, the rows there and back, the gradient rows and their weights there,
// dx and dw back) are what the plan counts for the layer.
TEST(ExpertExchange, BytesSentAreThePlansAllToAll) {
  const int G = world->size();
  LingConfig c = preset_config("tiny");
  c.num_hidden_layers = 1;
  c.first_k_dense_replace = 0;
  c.num_experts = 2 * G;
  c.num_experts_per_tok = 2;
  const int64_t E = c.num_experts, k = c.num_experts_per_tok, H = c.hidden_size, I = c.moe_intermediate_size;
  const int64_t T = E;  // token n's slots take experts n k, n k + 1 (mod E): 2 rows per expert
  std::vector<int32_t> ids;
  for (int64_t n = 0; n < T; ++n)
    for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int32_t>((n * k + j) % E));
  const DispatchPlan plan = plan_dispatch(Tensor::from_vector<int32_t>({T, k}, ids), E);
  Variable x(Tensor::full({T, H}, 0.5), true), w(Tensor::full({T, k}, 0.5), true);
  Variable gate_up(Tensor::full({E / G, 2 * I, H}, 0.01), true), down(Tensor::full({E / G, H, I}, 0.01), true);
  ExpertCommunicatorGroup group(*world);
  const int64_t before = world->bytes_sent();
  sum(expert_parallel_experts(x, w, plan, gate_up, down, group)).backward();

  PlanLayout layout;
  layout.ranks = G;
  layout.expert_parallel = G;
  PlanShape shape;
  shape.seq = T;
  shape.on_gpu = false;
  EXPECT_EQ(world->bytes_sent() - before, plan_training(c, layout, shape).traffic.expert_all_to_all);
}

TEST(ExpertExchange, ExpertsThatDoNotSplitAreOneError) {
  const std::vector<int64_t> counts(static_cast<size_t>(world->size() * 2 + 1), 1);
  EXPECT_THROW(ExpertExchange(*world, counts), Error);
}

// The routed experts split over the ranks against one process holding all of them that takes every
// rank's tokens as one micro-batch each (--accum G), in f32 and bit for bit: each rank's tokens get
// moe_experts' output and gradients for x and the routing weights, and a rank's experts' weight gradients
// are what the process accumulates over its micro-batches in rank order. Some experts get no rows.
TEST(ExpertExchange, ExpertParallelExpertsHaveTheBitsOfMicroBatches) {
  const int G = world->size(), r = world->rank();
  const int64_t L = 4, E = G * L, k = 2, H = 128, I = 64;
  auto random = [](const Shape& shape, uint64_t seed) {
    Rng rng(seed);
    return Tensor::randn(shape, rng, 0.5);
  };
  // The same weights on every rank; rank s's tokens, routing and incoming gradient, which every rank can make.
  const Tensor gate_up = random({E, 2 * I, H}, 11), down = random({E, H, I}, 12);
  struct Tokens {
    Tensor x, w, out_grad;
    DispatchPlan plan;
  };
  auto tokens_of = [&](int s) {
    const int64_t N = 64;
    // Experts 1 and E - 1 get no rows anywhere; a token's two slots take two different experts.
    std::vector<int32_t> ids;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t slot = 0; slot < k; ++slot) {
        const int64_t v = (n * 3 + slot + s) % (E - 2);
        ids.push_back(static_cast<int32_t>(v + (v >= 1 ? 1 : 0)));
      }
    const auto seed = static_cast<uint64_t>(s);
    return Tokens{random({N, H}, 100 + seed), random({N, k}, 200 + seed), random({N, H}, 300 + seed),
                  plan_dispatch(Tensor::from_vector<int32_t>({N, k}, ids), E)};
  };

  Variable gate_up_all(gate_up, true), down_all(down, true);
  Variable x_all, w_all;
  Tensor out_all;
  for (int s = 0; s < G; ++s) {
    const Tokens t = tokens_of(s);
    Variable x(t.x, true), w(t.w, true);
    const Variable out = moe_experts(x, w, t.plan, gate_up_all, down_all);
    sum(mul(out, Variable(t.out_grad))).backward();
    if (s == r) {
      x_all = x;
      w_all = w;
      out_all = out.value();
    }
  }

  const Tokens mine = tokens_of(r);
  Variable x_ep(mine.x, true), w_ep(mine.w, true);
  Variable gate_up_ep(gate_up.narrow(r * L, L).clone(), true), down_ep(down.narrow(r * L, L).clone(), true);
  ExpertCommunicatorGroup group(*world);
  const Variable out_ep = expert_parallel_experts(x_ep, w_ep, mine.plan, gate_up_ep, down_ep, group);
  sum(mul(out_ep, Variable(mine.out_grad))).backward();

  EXPECT_EQ(out_ep.value().to_vector<float>(), out_all.to_vector<float>()) << "output";
  EXPECT_EQ(x_ep.grad().to_vector<float>(), x_all.grad().to_vector<float>()) << "dx";
  EXPECT_EQ(w_ep.grad().to_vector<float>(), w_all.grad().to_vector<float>()) << "dw";
  EXPECT_EQ(gate_up_ep.grad().to_vector<float>(), gate_up_all.grad().narrow(r * L, L).to_vector<float>()) << "dgate_up";
  EXPECT_EQ(down_ep.grad().to_vector<float>(), down_all.grad().narrow(r * L, L).to_vector<float>()) << "ddown";
}

}  // namespace
}  // namespace lt
