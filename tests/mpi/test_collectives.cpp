// The communicator's collectives across real MPI ranks: run by CTest as `mpiexec -n N
// dist_mpi_tests N` for N = 2 and 4. The first check is that the world really has N ranks: a binary
// built against one MPI and launched by another runs N independent one-rank jobs without complaint.
// Reductions must equal the rank-order sum of every rank's values bit for bit, and repeat exactly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "tensor/derive_seed.h"
#include "tensor/random.h"
#include "tests/mpi/mpi_world.h"

namespace lt {

namespace mpi_test {
std::unique_ptr<Communicator> world;
int expected_size = 0;
}  // namespace mpi_test

namespace {

using mpi_test::expected_size;
using mpi_test::world;

// Rank r's values: a stream of (seed, r), so every rank can recompute every other rank's.
Tensor values_of(int rank, int64_t n, DType dtype, uint64_t seed) {
  Rng rng(derive_seed(seed, static_cast<uint64_t>(rank)));
  return Tensor::randn({n}, rng, 1.0, dtype);
}

template <class T>
std::vector<T> rank_order_sum(int64_t n, DType dtype, uint64_t seed, bool mean) {
  std::vector<T> total = values_of(0, n, dtype, seed).to_vector<T>();
  for (int r = 1; r < world->size(); ++r) {
    const std::vector<T> v = values_of(r, n, dtype, seed).to_vector<T>();
    for (int64_t i = 0; i < n; ++i) total[i] += v[i];
  }
  if (mean)
    for (T& x : total) x *= static_cast<T>(1.0 / world->size());
  return total;
}

TEST(Collectives, TheWorldHasTheLaunchedSize) {
  ASSERT_TRUE(launched_by_mpi()) << "not started by an MPI launcher";
  EXPECT_EQ(world->size(), expected_size) << "launched by an MPI other than the one lingtrain is built with?";
  EXPECT_GE(world->rank(), 0);
  EXPECT_LT(world->rank(), world->size());
}

TEST(Collectives, AllReduceIsTheRankOrderSumBitForBit) {
  // Sizes below, at and above the rank count, and not multiples of it.
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{1001}}) {
    Tensor x = values_of(world->rank(), n, DType::F32, 11);
    world->all_reduce(x, ReduceOp::Sum);
    EXPECT_EQ(x.to_vector<float>(), rank_order_sum<float>(n, DType::F32, 11, false)) << "n " << n;
    Tensor m = values_of(world->rank(), n, DType::F64, 12);
    world->all_reduce(m, ReduceOp::Mean);
    EXPECT_EQ(m.to_vector<double>(), rank_order_sum<double>(n, DType::F64, 12, true)) << "n " << n;
  }
}

TEST(Collectives, AllReduceRepeatsExactly) {
  std::vector<float> first;
  for (int i = 0; i < 5; ++i) {
    Tensor x = values_of(world->rank(), 4099, DType::F32, 13);
    world->all_reduce(x, ReduceOp::Mean);
    if (i == 0) first = x.to_vector<float>();
    else EXPECT_EQ(x.to_vector<float>(), first) << "repeat " << i;
  }
}

TEST(Collectives, AllGatherReduceScatterBroadcast) {
  const int P = world->size(), r = world->rank();
  const int64_t n = 7;
  Tensor mine = values_of(r, n, DType::F64, 14), gathered = Tensor::empty({P * n}, DType::F64);
  world->all_gather(mine, gathered);
  for (int q = 0; q < P; ++q)
    EXPECT_EQ(gathered.narrow(q * n, n).to_vector<double>(), values_of(q, n, DType::F64, 14).to_vector<double>());

  Tensor in = values_of(r, P * n, DType::F32, 15), out = Tensor::empty({n}, DType::F32);
  world->reduce_scatter(in, out, ReduceOp::Sum);
  const std::vector<float> total = rank_order_sum<float>(P * n, DType::F32, 15, false);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(total.begin() + r * n, total.begin() + (r + 1) * n));

  Tensor b = Tensor::full({5}, static_cast<double>(r), DType::I64);
  world->broadcast(b, P - 1);
  EXPECT_EQ(b.to_vector<int64_t>(), std::vector<int64_t>(5, P - 1));
  world->barrier();
}

// What rank `from` sends rank `to` in the all_to_all tests: a count that depends on both (some zero) and
// values that name sender, receiver and position.
int64_t part_count(int from, int to) { return (from + 2 * to) % 3 + (from == to ? 1 : 0); }
int32_t part_value(int from, int to, int64_t i) { return 1000 * from + 100 * to + static_cast<int32_t>(i); }

// All-to-all with equal parts (f64) and with parts whose sizes differ by pair, empty ones included (i32):
// every rank receives each rank's part for it, in rank order, and counts the bytes of the parts it sends
// away; counts that do not tile the buffers are one error on every rank, before any transfer.
TEST(Collectives, AllToAllDeliversEachPartToItsRank) {
  const int P = world->size(), r = world->rank();
  const int64_t n = 5;
  Tensor equal_in = values_of(r, P * n, DType::F64, 16), equal_out = Tensor::empty({P * n}, DType::F64);
  world->all_to_all(equal_in, equal_out);
  for (int q = 0; q < P; ++q)
    EXPECT_EQ(equal_out.narrow(q * n, n).to_vector<double>(),
              values_of(q, P * n, DType::F64, 16).narrow(r * n, n).to_vector<double>());

  std::vector<int64_t> send_counts, recv_counts;
  std::vector<int32_t> sent, expected;
  for (int q = 0; q < P; ++q) {
    send_counts.push_back(part_count(r, q));
    recv_counts.push_back(part_count(q, r));
    for (int64_t i = 0; i < part_count(r, q); ++i) sent.push_back(part_value(r, q, i));
    for (int64_t i = 0; i < part_count(q, r); ++i) expected.push_back(part_value(q, r, i));
  }
  const Tensor in = Tensor::from_vector<int32_t>({static_cast<int64_t>(sent.size())}, sent);
  Tensor out = Tensor::full({static_cast<int64_t>(expected.size())}, -1, DType::I32);
  const int64_t before = world->bytes_sent();
  world->all_to_all(in, send_counts, out, recv_counts);
  EXPECT_EQ(out.to_vector<int32_t>(), expected);
  int64_t away = 0;
  for (int q = 0; q < P; ++q)
    if (q != r) away += part_count(r, q) * 4;
  EXPECT_EQ(world->bytes_sent() - before, away);

  std::vector<int64_t> too_many = send_counts;
  too_many[0] += 1;
  EXPECT_THROW(world->all_to_all(in, too_many, out, recv_counts), Error);
  EXPECT_THROW(world->all_to_all(in, std::vector<int64_t>(send_counts.begin(), send_counts.end() - 1), out,
                                 recv_counts),
               Error);
  Tensor wrong_dtype = Tensor::empty(out.shape(), DType::F32);
  EXPECT_THROW(world->all_to_all(in, send_counts, wrong_dtype, recv_counts), Error);
  world->barrier();
}

TEST(Collectives, SplitMakesTheRowsAndColumnsOfAMesh) {
  const int P = world->size(), r = world->rank();
  const int columns = P % 2 == 0 ? 2 : 1;  // rows of `columns` consecutive ranks
  auto row = world->split(r / columns, r);
  auto column = world->split(r % columns, r);
  EXPECT_EQ(row->size(), columns);
  EXPECT_EQ(row->rank(), r % columns);
  EXPECT_EQ(column->size(), P / columns);
  EXPECT_EQ(column->rank(), r / columns);
  // A sum within the row: the ranks of this row, in order.
  Tensor x = Tensor::full({3}, static_cast<double>(r), DType::F64);
  row->all_reduce(x, ReduceOp::Sum);
  const int first = r / columns * columns;
  double expected = 0;
  for (int q = first; q < first + columns; ++q) expected += q;
  EXPECT_EQ(x.to_vector<double>(), std::vector<double>(3, expected));
}

}  // namespace
}  // namespace lt

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpiexec -n N dist_mpi_tests N\n");
    return 2;
  }
  lt::mpi_test::expected_size = std::atoi(argv[1]);
  lt::mpi_test::world = lt::make_world_communicator();
  // Only rank 0 reports; every rank's failures still set its exit code, which mpiexec passes on.
  if (lt::mpi_test::world->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int result = RUN_ALL_TESTS();
  lt::mpi_test::world.reset();
  return result;
}
