// Data parallel: every rank holds the whole model and optimiser, trains on its own rows of each step's
// batch, and after the backward the gradients are averaged across ranks (the trainer's after_backward
// hook), so every rank takes the identical optimiser step. The modules' buffers (the routing-warmup
// statistics, which each rank updates from its own rows) are averaged in the same hook, so every rank
// holds the same state and rank 0's checkpoint is everyone's.
#pragma once
#include <cstdint>
#include <vector>

#include "dist/communicator.h"
#include "optim/flat_parameters.h"

namespace lt {

class DataParallel {
 public:
  // Gradients go in buckets of about this many elements: big enough that a call's latency is paid
  // rarely, small enough that the reduction's scratch stays modest.
  static constexpr int64_t kBucketElements = int64_t{1} << 22;

  // comm: the ranks. For a model on GPUs it routes by device (route_by_device): the gradients and
  // buffers through NCCL, the agreement and the step statistics through MPI.
  explicit DataParallel(Communicator& comm) : comm_(comm) {}

  // Averages the gradients in the flat buffer (the stretches that hold one) and the buffers of `module`.
  // Fails with one clear line when the ranks disagree on which parameters have gradients.
  void average(FlatParameters& params, Module& module);

  // Sums a few step statistics across ranks (losses to average, counts to add), rank-order exact.
  void sum(std::vector<double>& values);

  Communicator& comm() { return comm_; }

 private:
  Communicator& comm_;
};

}  // namespace lt
