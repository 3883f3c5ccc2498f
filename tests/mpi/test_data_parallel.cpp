// Data parallel's gradient average begun during the backward (OverlappedAverage) against the average
// after it (DataParallel::average), across real MPI ranks: the same bytes, whatever order the gradients
// complete in on each rank, with buckets that split the parameters, a frozen parameter between them, and
// a second step on the same object.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "autograd/ops.h"
#include "dist/data_parallel.h"
#include "tensor/derive_seed.h"
#include "tensor/random.h"
#include "tests/mpi/mpi_world.h"

namespace lt {
namespace {

using mpi_test::world;

// Five trainable parameters around a frozen one, and a buffer.
class FiveLayers : public Module {
 public:
  FiveLayers() {
    for (const auto& [name, size, trainable] : std::vector<std::tuple<const char*, int64_t, bool>>{
             {"layers.0.w", 37, true}, {"layers.1.w", 70, true}, {"layers.2.frozen", 9, false},
             {"layers.3.w", 5, true}, {"layers.4.w", 100, true}, {"layers.5.w", 13, true}})
      add_parameter(name, Tensor::zeros({size}), true).set_requires_grad(trainable);
    add_buffer("layers.0.stats", Tensor::zeros({3}, DType::F64));
  }
};

Tensor values_of(int rank, int64_t n, DType dtype, uint64_t seed) {
  Rng rng(derive_seed(seed, static_cast<uint64_t>(rank)));
  return Tensor::randn({n}, rng, 1.0, dtype);
}

// This rank's gradients of step `step` (d/dv sum(v * g) = g) and its buffer.
void backward_of(FiveLayers& model, FlatParameters& params, int step) {
  params.zero_grad();
  uint64_t seed = 100 + 10 * static_cast<uint64_t>(step);
  for (const FlatParameters::ParameterRange& p : params.parameters()) {
    if (!p.parameter.value->requires_grad()) continue;
    const Tensor g = values_of(world->rank(), p.parameter.value->value().numel(), DType::F32, seed++);
    sum(mul(*p.parameter.value, Variable(g))).backward();
  }
  model.buffers()[0].value->copy_from(values_of(world->rank(), 3, DType::F64, 99 + step));
}

std::vector<char> bytes_of(const Tensor& t) {
  std::vector<char> out(t.nbytes());
  std::memcpy(out.data(), t.raw_data(), t.nbytes());
  return out;
}

TEST(DataParallel, TheAverageDuringTheBackwardHasTheBitsOfTheAverageAfterIt) {
  FiveLayers after_model, during_model;
  FlatParameters after(after_model.parameters()), during(during_model.parameters());
  DataParallel data_parallel(*world);
  OverlappedAverage overlapped(data_parallel, during, /*bucket_elements=*/64);
  for (int step = 0; step < 2; ++step) {
    backward_of(after_model, after, step);
    data_parallel.average(after, after_model);
    backward_of(during_model, during, step);
    // Each rank completes its gradients in an order of its own: the buckets still start in one order.
    std::vector<size_t> order(during.parameters().size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::rotate(order.begin(), order.begin() + (world->rank() + step) % static_cast<int>(order.size()), order.end());
    for (size_t i = 0; i + 1 < order.size(); ++i) overlapped.gradient_ready(order[i]);  // one left to finish()
    overlapped.finish(during, during_model);
    EXPECT_EQ(bytes_of(during.grads()), bytes_of(after.grads())) << "step " << step;
    EXPECT_EQ(bytes_of(*during_model.buffers()[0].value), bytes_of(*after_model.buffers()[0].value));
  }
}

}  // namespace
}  // namespace lt
