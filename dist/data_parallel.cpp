#include "dist/data_parallel.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "tensor/error.h"
#include "tensor/kernels.h"

namespace lt {

void DataParallel::all_reduce_mean(Communicator& comm, Tensor& grads, int64_t begin, int64_t end) {
  for (; begin < end; begin += kBucketElements) {
    Tensor bucket = grads.narrow(begin, std::min(kBucketElements, end - begin));
    comm.all_reduce(bucket, ReduceOp::Mean);
  }
}

void DataParallel::average(FlatParameters& params, Module& module) {
  if (comm_.size() == 1) return;
  const std::vector<FlatParameters::Run> runs = params.runs_with_grad(/*split_by_decay=*/false);
  // Every rank must reduce the same stretches, or the collectives below would pair different data.
  check_gradients_agree(runs);
  Tensor& grads = params.grads();
  for (const FlatPiece& piece : pieces(runs)) {
    if (!piece.experts) {
      all_reduce_mean(comm_, grads, piece.begin, piece.end);
      continue;
    }
    // The group's size is a power of two in every layout worth running, where this division is exact.
    Tensor experts = grads.narrow(piece.begin, piece.end - piece.begin);
    kernels::scale(experts, 1.0 / expert_group_->size(), experts);
    if (expert_copies_->size() > 1) all_reduce_mean(*expert_copies_, grads, piece.begin, piece.end);
  }
  average_buffers(module);
}

void DataParallel::set_expert_parallel(Communicator& group, Communicator& copies,
                                       std::vector<FlatParameters::Range> expert_ranges) {
  std::sort(expert_ranges.begin(), expert_ranges.end(),
            [](const FlatParameters::Range& a, const FlatParameters::Range& b) { return a.begin < b.begin; });
  expert_group_ = &group;
  expert_copies_ = &copies;
  expert_ranges_ = std::move(expert_ranges);
}

std::vector<FlatPiece> cut_at_experts(int64_t begin, int64_t end,
                                      const std::vector<FlatParameters::Range>& expert_ranges) {
  std::vector<FlatPiece> out;
  int64_t at = begin;
  for (const FlatParameters::Range& experts : expert_ranges) {
    const int64_t from = std::max(at, experts.begin), to = std::min(end, experts.end);
    if (from >= to) continue;
    if (at < from) out.push_back({at, from, false});
    out.push_back({from, to, true});
    at = to;
  }
  if (at < end) out.push_back({at, end, false});
  return out;
}

std::vector<FlatPiece> DataParallel::pieces(const std::vector<FlatParameters::Run>& runs) const {
  std::vector<FlatPiece> out;
  for (const FlatParameters::Run& run : runs) {
    const std::vector<FlatPiece> cut = cut_at_experts(run.begin, run.end, expert_ranges_);
    out.insert(out.end(), cut.begin(), cut.end());
  }
  return out;
}

double DataParallel::grad_sum_squares(const FlatParameters& params) {
  LT_CHECK(expert_group_ != nullptr, "data parallel: grad_sum_squares is for expert parallelism");
  const std::vector<FlatPiece> parts = pieces(params.runs_with_grad(/*split_by_decay=*/false));
  const Tensor& grads = params.grads();
  Tensor sums = Tensor::empty({static_cast<int64_t>(parts.size())}, grads.dtype(), grads.device());
  for (size_t i = 0; i < parts.size(); ++i) {
    Tensor sum = sums.narrow(static_cast<int64_t>(i), 1);
    kernels::sum_squares(grads.narrow(parts[i].begin, parts[i].end - parts[i].begin), sum);
  }
  // Each part summed in order on the host: the replicated ones give every rank the same figure, the expert
  // ones are summed over the group in rank order (and are the same on every copy of the group).
  const std::vector<double> host = sums.to(Device::cpu()).to(DType::F64).to_vector<double>();
  double replicated = 0, experts = 0;
  for (size_t i = 0; i < parts.size(); ++i) (parts[i].experts ? experts : replicated) += host[i];
  Tensor group_experts = Tensor::full({1}, experts, DType::F64);
  expert_group_->all_reduce(group_experts, ReduceOp::Sum);
  return replicated + group_experts.item();
}

void DataParallel::check_gradients_agree(const std::vector<FlatParameters::Run>& runs) {
  int64_t elements = 0;
  for (const FlatParameters::Run& run : runs) elements += run.end - run.begin;
  Tensor check = Tensor::full({1}, static_cast<double>(elements), DType::F64);
  comm_.all_reduce(check, ReduceOp::Mean);
  LT_CHECK(check.item() == static_cast<double>(elements), "data parallel: rank ", comm_.rank(), " has gradients for ",
           elements, " elements, the ranks' mean is ", check.item(), ": the ranks' models or batches differ");
}

void DataParallel::average_buffers(Module& module) {
  for (const Buffer& buffer : module.buffers()) comm_.all_reduce(*buffer.value, ReduceOp::Mean);
}

// One thread that runs the queued all-reduces in order. Shared with the thread itself, so that a worker
// left running when the run unwinds after an error (its collective waiting for ranks that will not come)
// keeps what it uses alive, and is left behind rather than joined.
struct OverlappedAverage::Worker {
  Communicator& comm;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Tensor> queue;
  bool busy = false, stopping = false;
  std::exception_ptr error;
  std::thread thread;

  explicit Worker(Communicator& c) : comm(c) {}

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      changed.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) return;
      Tensor bucket = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      try {
        if (!error) comm.all_reduce(bucket, ReduceOp::Mean);
      } catch (...) {
        const std::lock_guard<std::mutex> relock(mutex);
        error = std::current_exception();
      }
      lock.lock();
      busy = false;
      changed.notify_all();
    }
  }
};

OverlappedAverage::OverlappedAverage(DataParallel& data_parallel, FlatParameters& params, int64_t bucket_elements)
    : data_parallel_(data_parallel), grads_(params.grads()) {
  const auto& parameters = params.parameters();
  bucket_of_.assign(parameters.size(), -1);
  // Last parameters first; a bucket is a contiguous stretch (padding included), closed once it holds
  // bucket_elements.
  for (size_t i = parameters.size(); i-- > 0;) {
    if (!parameters[i].parameter.value->requires_grad()) continue;
    const int64_t begin = parameters[i].range.begin;
    const int64_t end = i + 1 < parameters.size() ? parameters[i + 1].range.begin : params.numel();
    if (buckets_.empty() || buckets_.back().end - buckets_.back().begin >= bucket_elements ||
        buckets_.back().begin != end)
      buckets_.push_back({end, end, 0});
    Bucket& bucket = buckets_.back();
    bucket.begin = begin;
    ++bucket.parameters;
    bucket_of_[i] = static_cast<int>(buckets_.size() - 1);
  }
  // The ranks' buckets must be the same, or their collectives would pair different data.
  std::vector<FlatParameters::Run> trained;
  for (const Bucket& bucket : buckets_) trained.push_back({bucket.begin, bucket.end, false});
  data_parallel_.check_gradients_agree(trained);
  for (const Bucket& bucket : buckets_) waiting_.push_back(bucket.parameters);
  worker_ = std::make_shared<Worker>(data_parallel_.comm());
  worker_->thread = std::thread([worker = worker_] { worker->run(); });
}

OverlappedAverage::~OverlappedAverage() {
  std::unique_lock<std::mutex> lock(worker_->mutex);
  worker_->stopping = true;
  worker_->changed.notify_all();
  const bool idle = !worker_->busy && worker_->queue.empty();
  worker_->queue.clear();
  lock.unlock();
  if (idle) worker_->thread.join();
  else worker_->thread.detach();
}

void OverlappedAverage::gradient_ready(size_t index) {
  if (index >= bucket_of_.size() || bucket_of_[index] < 0) return;
  const int bucket = bucket_of_[index];
  if (--waiting_[static_cast<size_t>(bucket)] == 0) start_ready_buckets(/*all=*/false);
}

void OverlappedAverage::start_ready_buckets(bool all) {
  const std::lock_guard<std::mutex> lock(worker_->mutex);
  while (next_to_start_ < buckets_.size() && (all || waiting_[next_to_start_] <= 0)) {
    const Bucket& bucket = buckets_[next_to_start_++];
    worker_->queue.push_back(grads_.narrow(bucket.begin, bucket.end - bucket.begin));
  }
  worker_->changed.notify_all();
}

void OverlappedAverage::finish(FlatParameters& params, Module& module) {
  start_ready_buckets(/*all=*/true);
  {
    std::unique_lock<std::mutex> lock(worker_->mutex);
    worker_->changed.wait(lock, [&] { return worker_->queue.empty() && !worker_->busy; });
    if (worker_->error) std::rethrow_exception(std::exchange(worker_->error, nullptr));
  }
  next_to_start_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].parameters;
  // As average(): the ranks must agree on which parameters took a gradient this step.
  data_parallel_.check_gradients_agree(params.runs_with_grad(/*split_by_decay=*/false));
  data_parallel_.average_buffers(module);
}

void DataParallel::sum(std::vector<double>& values) {
  if (comm_.size() == 1 || values.empty()) return;
  Tensor t = Tensor::from_vector<double>({static_cast<int64_t>(values.size())}, values);
  comm_.all_reduce(t, ReduceOp::Sum);
  values = t.to_vector<double>();
}

}  // namespace lt
