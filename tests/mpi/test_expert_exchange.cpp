// Expert parallelism's token exchange across real ranks (dist/expert_exchange.h): each rank's rows reach
// the rank of their expert laid out expert by expert (each expert's rows in source-rank order), come back
// to where they were bit for bit, and the autograd ops send gradients back the other way (each is the
// other's adjoint). Counts differ by rank and by expert, zeros included (an expert no rank routes to, a
// rank that sends another nothing).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "autograd/ops.h"
#include "dist/expert_exchange.h"
#include "tests/mpi/mpi_world.h"

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

TEST(ExpertExchange, ExpertsThatDoNotSplitAreOneError) {
  const std::vector<int64_t> counts(static_cast<size_t>(world->size() * 2 + 1), 1);
  EXPECT_THROW(ExpertExchange(*world, counts), Error);
}

}  // namespace
}  // namespace lt
