// route_by_device (dist/communicator.h): the communicator of a model on GPUs sends each tensor through
// the communicator of its memory (CUDA tensors through the device one, CPU tensors through the host
// one), counts what they sent as its own, and splits both sides alike. Checked against two recording
// communicators; the CUDA half needs a device, so in lingtrain_tests it skips without a GPU and in
// lingtrain_emulated_gpu_tests it runs on the emulated one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist/communicator.h"
#include "tensor/device.h"

namespace lt {
namespace {

// One rank of `size`, which logs every call as "<name>.<call>" and counts a byte per element sent.
class Recording : public Communicator {
 public:
  Recording(std::string name, int rank, int size, std::vector<std::string>& log)
      : name_(std::move(name)), rank_(rank), size_(size), log_(log) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return name_; }
  void all_reduce(Tensor& x, ReduceOp) override { record("all_reduce", x); }
  void all_gather(const Tensor& in, Tensor&) override { record("all_gather", in); }
  void reduce_scatter(const Tensor& in, Tensor&, ReduceOp) override { record("reduce_scatter", in); }
  void gather(const Tensor& in, Tensor&, int) override { record("gather", in); }
  void broadcast(Tensor& x, int) override { record("broadcast", x); }
  void all_to_all(const Tensor& in, const std::vector<int64_t>&, Tensor&, const std::vector<int64_t>&) override {
    record("all_to_all", in);
  }
  void barrier() override { log_.push_back(name_ + ".barrier"); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    log_.push_back(name_ + ".split");
    return std::make_unique<Recording>(name_ + "/" + std::to_string(color), key, 1, log_);
  }

 private:
  void record(const char* call, const Tensor& t) {
    log_.push_back(name_ + "." + call);
    bytes_sent_ += t.numel();
  }
  std::string name_;
  int rank_, size_;
  std::vector<std::string>& log_;
};

void call_every_collective(Communicator& comm, const Tensor& t) {
  Tensor x = t.clone(), out = t.clone();
  comm.all_reduce(x, ReduceOp::Sum);
  comm.all_gather(t, out);
  comm.reduce_scatter(t, out, ReduceOp::Mean);
  comm.gather(t, out, 0);
  comm.broadcast(x, 0);
  comm.all_to_all(t, {t.numel(), 0}, out, {t.numel(), 0});
}

void expect_every_call_went_to(const std::vector<std::string>& log, const std::string& name) {
  ASSERT_EQ(log.size(), 6u);
  const std::vector<std::string> calls = {"all_reduce", "all_gather", "reduce_scatter", "gather", "broadcast",
                                          "all_to_all"};
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(log[i], name + "." + calls[i]);
}

TEST(RouteByDevice, CpuTensorsGoThroughTheHostCommunicator) {
  std::vector<std::string> log;
  Recording host("mpi", 1, 4, log);
  auto routed = route_by_device(host, std::make_unique<Recording>("nccl", 1, 4, log));
  EXPECT_EQ(routed->rank(), 1);
  EXPECT_EQ(routed->size(), 4);
  call_every_collective(*routed, Tensor::zeros({6}));
  expect_every_call_went_to(log, "mpi");
  EXPECT_EQ(routed->bytes_sent(), 6 * 6);
  log.clear();
  routed->barrier();
  EXPECT_EQ(log, (std::vector<std::string>{"mpi.barrier"}));
}

TEST(RouteByDevice, CudaTensorsGoThroughTheDeviceCommunicatorAndSplitsRouteAlike) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
  std::vector<std::string> log;
  Recording host("mpi", 0, 2, log);
  auto routed = route_by_device(host, std::make_unique<Recording>("nccl", 0, 2, log));
  call_every_collective(*routed, Tensor::zeros({5}, DType::F32, Device::cuda(0)));
  expect_every_call_went_to(log, "nccl");
  EXPECT_EQ(routed->bytes_sent(), 6 * 5);
  log.clear();
  auto group = routed->split(3, 0);
  EXPECT_EQ(log, (std::vector<std::string>{"mpi.split", "nccl.split"}));
  log.clear();
  Tensor on_cpu = Tensor::zeros({2}), on_gpu = Tensor::zeros({2}, DType::F32, Device::cuda(0));
  group->all_reduce(on_cpu, ReduceOp::Sum);
  group->all_reduce(on_gpu, ReduceOp::Sum);
  EXPECT_EQ(log, (std::vector<std::string>{"mpi/3.all_reduce", "nccl/3.all_reduce"}));
  EXPECT_EQ(group->bytes_sent(), 4);
  EXPECT_EQ(routed->bytes_sent(), 6 * 5);
}

TEST(RouteByDevice, RefusesGroupsThatDifferWithOneLine) {
  std::vector<std::string> log;
  Recording host("mpi", 0, 2, log);
  try {
    route_by_device(host, std::make_unique<Recording>("nccl", 0, 4, log));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "route_by_device: the device group (rank 0 of 4) is not the host group (rank 0 of 2)");
  }
}

}  // namespace
}  // namespace lt
