// The NCCL communicator against the MPI one, over the same ranks (this file joins dist_mpi_tests, run by
// CTest as `mpiexec -n N`). Each collective runs on CUDA copies of the data through NCCL and on the CPU
// originals through MPI; both sum in rank order in the same dtype, so the results must be the same
// bytes, and repeat exactly. NCCL drives one GPU per rank: with fewer GPUs than ranks (none, on the
// machines that build lingtrain) these cases skip, and only the construction's error is checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "dist/edit.h"
#include "dist/expert_exchange.h"
#include "dist/nccl_communicator.h"
#include "tensor/derive_seed.h"
#include "nn/module.h"
#include "optim/flat_parameters.h"
#include "tensor/random.h"

namespace lt {
namespace {

// Rank r's values: a stream of (seed, r).
Tensor values_of(int rank, int64_t n, DType dtype, uint64_t seed) {
  Rng rng(derive_seed(seed, static_cast<uint64_t>(rank)));
  return Tensor::randn({n}, rng, 1.0, dtype);
}

// The bytes of t, wherever it lives (the copy to the host waits for the GPU's queued work).
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  const auto* begin = static_cast<const uint8_t*>(host.raw_data());
  return std::vector<uint8_t>(begin, begin + host.nbytes());
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

class Nccl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mpi = make_world_communicator();
#ifdef LINGTRAIN_NCCL
    if (cuda_device_count() < mpi->size()) {
      skip_reason = "NCCL needs one GPU per rank: " + std::to_string(mpi->size()) + " ranks, " +
                    std::to_string(cuda_device_count()) + " usable CUDA device(s)";
      return;
    }
    // Collective: every rank gets here, whatever the outcome of the test before.
    try {
      nccl = make_nccl_communicator(*mpi);
    } catch (const Error& e) {
      setup_error = e.what();
    }
#else
    skip_reason = "built without NCCL";
#endif
  }
  static void TearDownTestSuite() {
    nccl.reset();
    mpi.reset();
  }
  void SetUp() override {
    if (!skip_reason.empty()) GTEST_SKIP() << skip_reason;
    ASSERT_TRUE(nccl) << setup_error;
    device = nccl_device(mpi->rank());
  }

  static std::unique_ptr<Communicator> mpi, nccl;
  static std::string skip_reason, setup_error;
  Device device;
};
std::unique_ptr<Communicator> Nccl::mpi, Nccl::nccl;
std::string Nccl::skip_reason, Nccl::setup_error;

TEST_F(Nccl, HasTheRanksOfItsBootstrap) {
  EXPECT_EQ(nccl->size(), mpi->size());
  EXPECT_EQ(nccl->rank(), mpi->rank());
}

TEST_F(Nccl, AllReduceEqualsMpisBitForBit) {
  // Sizes below, at and above the rank count, not multiples of it, and a multiple of it (the sums are
  // gathered in place then).
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{1001}, int64_t{4096}})
    for (DType dtype : {DType::F32, DType::F64})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        Tensor on_cpu = values_of(mpi->rank(), n, dtype, 21);
        Tensor on_gpu = on_cpu.to(device);
        mpi->all_reduce(on_cpu, op);
        nccl->all_reduce(on_gpu, op);
        EXPECT_EQ(bytes_of(on_gpu), bytes_of(on_cpu))
            << "n " << n << " " << dtype_name(dtype) << (op == ReduceOp::Mean ? " mean" : " sum");
      }
}

TEST_F(Nccl, AllReduceRepeatsExactly) {
  const Tensor values = values_of(mpi->rank(), (int64_t{1} << 20) + 3, DType::F32, 22).to(device);
  std::vector<uint8_t> first;
  for (int i = 0; i < 5; ++i) {
    Tensor x = values.clone();
    nccl->all_reduce(x, ReduceOp::Mean);
    if (i == 0) first = bytes_of(x);
    else EXPECT_EQ(bytes_of(x), first) << "repeat " << i;
  }
}

TEST_F(Nccl, ReduceScatterEqualsMpisBitForBit) {
  const int P = mpi->size();
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}})
    for (DType dtype : {DType::F32, DType::F64})
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean}) {
        const Tensor in = values_of(mpi->rank(), P * n, dtype, 23);
        Tensor out_cpu = Tensor::empty({n}, dtype), out_gpu = Tensor::empty({n}, dtype, device);
        mpi->reduce_scatter(in, out_cpu, op);
        nccl->reduce_scatter(in.to(device), out_gpu, op);
        EXPECT_EQ(bytes_of(out_gpu), bytes_of(out_cpu))
            << "n " << n << " " << dtype_name(dtype) << (op == ReduceOp::Mean ? " mean" : " sum");
      }
}

TEST_F(Nccl, AllGatherGatherAndBroadcastMoveTheBytes) {
  const int P = mpi->size(), r = mpi->rank();
  for (DType dtype : {DType::F64, DType::BF16}) {
    const Tensor mine = values_of(r, 7, dtype, 24);
    Tensor gathered_cpu = Tensor::empty({P * 7}, dtype), gathered_gpu = Tensor::empty({P * 7}, dtype, device);
    mpi->all_gather(mine, gathered_cpu);
    nccl->all_gather(mine.to(device), gathered_gpu);
    EXPECT_EQ(bytes_of(gathered_gpu), bytes_of(gathered_cpu)) << dtype_name(dtype);
  }
  for (int root : {0, P - 1}) {
    Tensor ids = Tensor::full({5}, static_cast<double>(r), DType::I64, device);
    nccl->broadcast(ids, root);
    EXPECT_EQ(ids.to_vector<int64_t>(), std::vector<int64_t>(5, root));
    const Tensor original = values_of(r, 33, DType::F32, 25);
    Tensor on_cpu = original.clone(), on_gpu = original.to(device);
    mpi->broadcast(on_cpu, root);
    nccl->broadcast(on_gpu, root);
    EXPECT_EQ(bytes_of(on_gpu), bytes_of(on_cpu)) << "root " << root;
    Tensor at_root_cpu = Tensor::empty({P * 33}), at_root_gpu = Tensor::empty({P * 33}, DType::F32, device);
    mpi->gather(original, at_root_cpu, root);
    nccl->gather(original.to(device), at_root_gpu, root);
    if (r == root) {
      EXPECT_EQ(bytes_of(at_root_gpu), bytes_of(at_root_cpu)) << "gather to root " << root;
    }
  }
  nccl->barrier();
}

// Variable splits (rank r sends rank j (r + 2 j) % 3 rows of 5, some of them none) and the experts'
// exchange over them: NCCL's grouped sends and receives deliver MPI's bytes.
TEST_F(Nccl, AllToAllAndTheExpertExchangeMoveMpisBytes) {
  const int P = mpi->size(), r = mpi->rank();
  std::vector<int64_t> send, recv;
  for (int j = 0; j < P; ++j) {
    send.push_back(5 * ((r + 2 * j) % 3));
    recv.push_back(5 * ((j + 2 * r) % 3));
  }
  int64_t sent = 0, received = 0;
  for (int j = 0; j < P; ++j) {
    sent += send[static_cast<size_t>(j)];
    received += recv[static_cast<size_t>(j)];
  }
  const Tensor in = values_of(r, sent, DType::F32, 27);
  Tensor out_cpu = Tensor::empty({received}), out_gpu = Tensor::empty({received}, DType::F32, device);
  mpi->all_to_all(in, send, out_cpu, recv);
  nccl->all_to_all(in.to(device), send, out_gpu, recv);
  EXPECT_EQ(bytes_of(out_gpu), bytes_of(out_cpu));

  std::vector<int64_t> counts;  // rows per expert, two experts a rank
  for (int e = 0; e < 2 * P; ++e) counts.push_back((e + r) % 3);
  int64_t rows = 0;
  for (const int64_t c : counts) rows += c;
  const Tensor x = values_of(r, rows * 4, DType::F32, 28).reshape({rows, 4});
  const std::unique_ptr<Communicator> routed = route_by_device(*mpi, make_nccl_communicator(*mpi));
  const ExpertExchange on_cpu(*mpi, counts), on_gpu(*routed, counts);
  EXPECT_EQ(bytes_of(on_gpu.to_experts(x.to(device))), bytes_of(on_cpu.to_experts(x)));
}

TEST_F(Nccl, SplitMatchesMpisSplit) {
  const int P = mpi->size(), r = mpi->rank();
  const int columns = P % 2 == 0 ? 2 : 1;  // rows of `columns` consecutive ranks
  const auto mpi_row = mpi->split(r / columns, r);
  const auto nccl_row = nccl->split(r / columns, r);
  const auto nccl_column = nccl->split(r % columns, r);
  EXPECT_EQ(nccl_row->size(), columns);
  EXPECT_EQ(nccl_row->rank(), r % columns);
  EXPECT_EQ(nccl_column->size(), P / columns);
  EXPECT_EQ(nccl_column->rank(), r / columns);
  Tensor on_cpu = values_of(r, 101, DType::F32, 26), on_gpu = on_cpu.to(device);
  mpi_row->all_reduce(on_cpu, ReduceOp::Sum);
  nccl_row->all_reduce(on_gpu, ReduceOp::Sum);
  EXPECT_EQ(bytes_of(on_gpu), bytes_of(on_cpu));
}

// Every rank passes the same wrong tensor, so every rank fails before any transfer starts.
// A model of two parameters and a buffer, for data parallel on each device.
class TwoLayers : public Module {
 public:
  TwoLayers() {
    add_parameter("layers.0.w", Tensor::zeros({37}), true);
    add_parameter("layers.1.w", Tensor::zeros({70}), true);
    add_buffer("layers.0.stats", Tensor::zeros({3}, DType::F64));
  }
};

// Data parallel with the model on one GPU per rank (--device cuda under mpirun): gradients and buffers
// travel through NCCL and come out as the same bytes as the CPU model's through MPI.
TEST_F(Nccl, DataParallelOnGpusAveragesAsOnTheCpu) {
  TwoLayers on_cpu, on_gpu;
  on_gpu.to(device);
  FlatParameters cpu_params(on_cpu.parameters()), gpu_params(on_gpu.parameters());
  // Each rank's own gradients: d/dv sum(v * g) = g.
  for (auto* params : {&cpu_params, &gpu_params}) {
    uint64_t seed = 40;
    for (const FlatParameters::ParameterRange& p : params->parameters()) {
      const Tensor& v = p.parameter.value->value();
      const Tensor g = values_of(mpi->rank(), v.numel(), DType::F32, seed++).to(v.device());
      sum(mul(*p.parameter.value, Variable(g))).backward();
    }
  }
  on_cpu.buffers()[0].value->copy_from(values_of(mpi->rank(), 3, DType::F64, 49));
  on_gpu.buffers()[0].value->copy_from(values_of(mpi->rank(), 3, DType::F64, 49));
  DataParallel(*mpi).average(cpu_params, on_cpu);
  const auto gpu_world = route_by_device(*mpi, nccl->split(0, mpi->rank()));
  DataParallel(*gpu_world).average(gpu_params, on_gpu);
  EXPECT_EQ(bytes_of(gpu_params.grads()), bytes_of(cpu_params.grads()));
  EXPECT_EQ(bytes_of(*on_gpu.buffers()[0].value), bytes_of(*on_cpu.buffers()[0].value));
}

// EDiT with the replicas on GPUs (--dist edit --device cuda under mpirun): the pseudo-gradients, the
// shards and the buffers travel through NCCL, the per-layer tables through MPI, and two syncs leave
// every rank where the CPU's syncs leave it, to the rounding of the GPU's norm sums. With shard groups
// of one rank and, on an even world, of two (then every layer's norm spans two ranks' shards).
TEST_F(Nccl, EditSyncOnGpusMatchesTheCpu) {
  const int P = mpi->size(), r = mpi->rank();
  const auto gpu_world = route_by_device(*mpi, nccl->split(0, r));
  EditSettings settings;
  settings.outer_sgd = true;
  settings.weight_by_norm = true;
  settings.clip_pseudo_grad = 0.5;
  for (int shards : {1, P % 2 == 0 ? 2 : 1}) {
    settings.shard_group = shards;
    TwoLayers cpu_model, gpu_model;
    gpu_model.to(device);
    FlatParameters cpu_params(cpu_model.parameters(), shards), gpu_params(gpu_model.parameters(), shards);
    Edit on_cpu(EditMesh::build(*mpi, shards), settings, cpu_params, cpu_model);
    Edit on_gpu(EditMesh::build(*gpu_world, shards), settings, gpu_params, gpu_model);
    const int64_t n = cpu_params.numel();
    for (int round = 0; round < 3; ++round) {
      // Round 0 takes the anchor from one shared start; later rounds start from each rank's own values.
      const Tensor values = values_of(round == 0 ? 0 : r, n, DType::F32, 60 + round);
      cpu_params.values().copy_from(values);
      gpu_params.values().copy_from(values);
      cpu_model.buffers()[0].value->copy_from(values_of(r, 3, DType::F64, 70 + round));
      gpu_model.buffers()[0].value->copy_from(values_of(r, 3, DType::F64, 70 + round));
      on_cpu.sync(4);
      on_gpu.sync(4);
      const std::vector<float> want = cpu_params.values().to_vector<float>();
      const std::vector<float> got = gpu_params.values().to(Device::cpu()).to_vector<float>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i])))
            << "shard group " << shards << ", round " << round << ", element " << i;
      EXPECT_EQ(bytes_of(*gpu_model.buffers()[0].value), bytes_of(*cpu_model.buffers()[0].value));
    }
  }
}

TEST_F(Nccl, RejectsTensorsItCannotReduceWithOneLine) {
  Tensor on_cpu = Tensor::zeros({4});
  EXPECT_EQ(error_of([&] { nccl->all_reduce(on_cpu, ReduceOp::Sum); }),
            "all_reduce: x must be a CUDA tensor on " + device.str() +
                " (the NCCL communicator moves that GPU's memory), got f32[4] cpu");
  Tensor ints = Tensor::zeros({4}, DType::I32, device);
  EXPECT_EQ(error_of([&] { nccl->all_reduce(ints, ReduceOp::Sum); }),
            "all_reduce: x must be f32 or f64, got i32[4] " + device.str());
  Tensor out = Tensor::empty({3}, DType::F32, device);
  EXPECT_NE(error_of([&] { nccl->reduce_scatter(Tensor::zeros({4}, DType::F32, device), out, ReduceOp::Sum); })
                .find("reduce_scatter: in must hold"),
            std::string::npos);
}

// What every machine can check: without a GPU (or without NCCL) construction fails on every rank
// with one line, instead of leaving the ranks waiting for each other.
TEST(NcclWithoutGpu, ConstructionFailsWithOneLine) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  const std::unique_ptr<Communicator> mpi = make_world_communicator();
  const std::string error = error_of([&] { make_nccl_communicator(*mpi); });
#ifdef LINGTRAIN_NCCL
  EXPECT_EQ(error, "NCCL communicator: this rank has no usable CUDA device (cudaGetDeviceCount failed or found none)");
#else
  EXPECT_NE(error.find("built without NCCL"), std::string::npos) << error;
#endif
}

}  // namespace
}  // namespace lt
