// Without an MPI launcher a run is one process: the world communicator is the single-process one, and
// its collectives are the identities (a sum over one rank), so code written for N ranks runs
// unchanged on one.
#include <gtest/gtest.h>

#include "dist/communicator.h"

namespace lt {
namespace {

TEST(SingleProcess, CollectivesAreIdentities) {
  if (launched_by_mpi()) GTEST_SKIP() << "running under an MPI launcher";
  auto world = make_world_communicator();
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->rank(), 0);
  Tensor x = Tensor::from_vector<float>({3}, {1.5f, -2.0f, 0.25f});
  world->all_reduce(x, ReduceOp::Mean);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 0.25f}));
  Tensor gathered = Tensor::empty({3});
  world->all_gather(x, gathered);
  EXPECT_EQ(gathered.to_vector<float>(), x.to_vector<float>());
  Tensor scattered = Tensor::empty({3});
  world->reduce_scatter(x, scattered, ReduceOp::Sum);
  EXPECT_EQ(scattered.to_vector<float>(), x.to_vector<float>());
  Tensor exchanged = Tensor::empty({3});
  world->all_to_all(x, exchanged);
  EXPECT_EQ(exchanged.to_vector<float>(), x.to_vector<float>());
  Tensor two = Tensor::empty({2});
  EXPECT_THROW(world->all_to_all(x, {3}, two, {2}), Error);
  EXPECT_THROW(world->all_to_all(x, {2, 1}, exchanged, {3}), Error);
  EXPECT_THROW(world->broadcast(x, 1), Error);
  EXPECT_EQ(world->split(0, 0)->size(), 1);
  Tensor ids = Tensor::zeros({2}, DType::I32);
  EXPECT_THROW(world->all_reduce(ids, ReduceOp::Sum), Error);
}

}  // namespace
}  // namespace lt
