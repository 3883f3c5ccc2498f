// Data parallel: every rank holds the whole model and optimiser, trains on its own rows of each step's
// batch, and the gradients are averaged across ranks after the backward (average) or during its last
// one (OverlappedAverage), done by the trainer's after_backward hook, so every rank takes the identical
// optimiser step. The modules' buffers (the routing warmup's observations of the step, which each rank
// makes from its own rows) are averaged in the same hook, so every rank holds the same state and rank
// 0's checkpoint is everyone's.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "optim/flat_parameters.h"

namespace lt {

// A stretch [begin, end) of the flat buffers, and whether it lies in a rank's own routed experts (expert
// parallelism: the stretches that differ between the ranks of an expert-parallel group).
struct FlatPiece {
  int64_t begin = 0, end = 0;
  bool experts = false;
};
// [begin, end) cut where one of `expert_ranges` (sorted, disjoint) begins or ends, in order.
std::vector<FlatPiece> cut_at_experts(int64_t begin, int64_t end,
                                      const std::vector<FlatParameters::Range>& expert_ranges);

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
  // average()'s parts that OverlappedAverage shares: the check that every rank has gradients for as
  // many elements (one clear line when not), and the buffers' average.
  void check_gradients_agree(const std::vector<FlatParameters::Run>& runs);
  void average_buffers(Module& module);

  // Expert parallelism (--expert-parallel G): the ranks of `group` (G consecutive ranks) hold different
  // routed experts, which sit in the stretches `expert_ranges` of the flat buffers (the same stretches on
  // every rank: each holds E / G experts of every MoE layer). A rank's expert gradients already sum the
  // contributions of every token of its group routed to its experts (the exchange's backward brings them
  // home), each rank's loss the mean over its own tokens: so they are divided by G and averaged over
  // `copies` (the ranks holding the same experts) alone, where the other gradients average over all ranks.
  // Both results are the gradient of the mean loss over every rank's tokens.
  void set_expert_parallel(Communicator& group, Communicator& copies, std::vector<FlatParameters::Range> expert_ranges);
  // The squared gradient norm of the whole model, identical on every rank: the replicated parameters'
  // part, plus the expert parts summed over the group. Only with set_expert_parallel.
  double grad_sum_squares(const FlatParameters& params);

  // Sums a few step statistics across ranks (losses to average, counts to add), rank-order exact.
  void sum(std::vector<double>& values);

  Communicator& comm() { return comm_; }

 private:
  // The runs cut where an expert stretch begins or ends.
  std::vector<FlatPiece> pieces(const std::vector<FlatParameters::Run>& runs) const;
  void all_reduce_mean(Communicator& comm, Tensor& grads, int64_t begin, int64_t end);

  Communicator& comm_;
  Communicator* expert_group_ = nullptr;
  Communicator* expert_copies_ = nullptr;
  std::vector<FlatParameters::Range> expert_ranges_;  // sorted, disjoint
};

// The same average begun during the step's last backward, so that the all-reduce of the last layers'
// gradients overlaps the backward of the first: the trainable parameters in buckets of about
// DataParallel::kBucketElements, last parameters first (the order a backward completes them), and a
// bucket's all-reduce starts on a thread of this object's as soon as the backward has completed every
// gradient in it (gradient_ready, from autograd's LeafGradientsReady through the trainer's hook). Buckets
// start in their fixed order on every rank, whatever the order their gradients complete in, so the ranks'
// collectives pair up. finish() starts the buckets the backward did not complete (parameters that got no
// gradient), waits for them all, then averages the buffers and checks the ranks agree, as average()
// does. The results are average()'s to the bit: an all-reduce sums each element in rank order, whatever
// bucket carries it. While buckets are in flight the main thread makes no call on the communicator
// (Communicator::callable_from_another_thread).
class OverlappedAverage {
 public:
  OverlappedAverage(DataParallel& data_parallel, FlatParameters& params,
                    int64_t bucket_elements = DataParallel::kBucketElements);
  ~OverlappedAverage();
  OverlappedAverage(const OverlappedAverage&) = delete;
  OverlappedAverage& operator=(const OverlappedAverage&) = delete;

  // Parameter `index` (of FlatParameters::parameters()) has its complete gradient for this step.
  void gradient_ready(size_t index);
  // Every gradient averaged, the buffers of `module` too; ready for the next step.
  void finish(FlatParameters& params, Module& module);

  struct Worker;  // the thread and its queue (dist/data_parallel.cpp)

 private:
  DataParallel& data_parallel_;
  struct Bucket {
    int64_t begin = 0, end = 0;  // in the flat buffers
    int parameters = 0;          // trainable parameters in it
  };
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;    // per parameter: its bucket, or -1 when it takes no gradient
  std::vector<int> waiting_;      // per bucket: its parameters whose gradient is not complete yet
  size_t next_to_start_ = 0;
  std::shared_ptr<Worker> worker_;
  Tensor grads_;

  void start_ready_buckets(bool all);
};

}  // namespace lt
