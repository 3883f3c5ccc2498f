// The device counters (tensor/device_counters.h) on the emulated GPU: what each kind of work counts,
// and a training step with moe-m's structure held under ceilings, so that a change which adds launches,
// host waits, GEMM calls or driver allocations to the GPU step fails here, on a machine without one.
#include <gtest/gtest.h>

#include "bench/bench.h"
#include "tensor/bf16_shadow.h"
#include "tensor/device_counters.h"
#include "tensor/device_runtime.h"
#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace lt {
namespace {

TEST(DeviceCounters, CountCopiesByDirectionAndTheWaitsTheyImply) {
  const Tensor host = Tensor::from_vector<float>({4}, {1, 2, 3, 4});
  const DeviceCounters start = device_counters();
  const Tensor on_device = host.to(Device::cuda(0));
  const DeviceCounters after_upload = device_counters() - start;
  EXPECT_EQ(after_upload.h2d_copies, 1u);
  EXPECT_EQ(after_upload.h2d_bytes, 16u);
  EXPECT_EQ(after_upload.host_syncs, 0u) << "a small upload is staged in pinned memory and queued";
  Tensor copy = Tensor::empty({4}, DType::F32, Device::cuda(0));
  copy.copy_from(on_device);
  const DeviceCounters after_d2d = device_counters() - start;
  EXPECT_EQ(after_d2d.d2d_copies, 1u);
  EXPECT_EQ(after_d2d.host_syncs, 0u) << "a copy within the device is queued, not waited for";
  EXPECT_EQ(copy.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  const DeviceCounters after_read = device_counters() - start;
  EXPECT_EQ(after_read.d2h_copies, 1u);
  EXPECT_EQ(after_read.d2h_bytes, 16u);
  EXPECT_EQ(after_read.host_syncs, 1u);
  const Tensor large = Tensor::zeros({static_cast<int64_t>(cuda::kStagedCopyBytes / 4) + 1});
  const DeviceCounters before_large = device_counters();
  const Tensor large_on_device = large.to(Device::cuda(0));
  EXPECT_EQ((device_counters() - before_large).host_syncs, 1u) << "a large upload goes through cudaMemcpy";
}

TEST(DeviceCounters, CountLaunchesAndBlasCallsWithTheirFlops) {
  Tensor a = Tensor::zeros({3, 5}, DType::F32, Device::cuda(0)), b = Tensor::zeros({5, 7}, DType::F32, Device::cuda(0));
  Tensor c = Tensor::empty({3, 7}, DType::F32, Device::cuda(0));
  const DeviceCounters start = device_counters();
  kernels::matmul(a, false, b, false, c, 1.0, 0.0);
  const DeviceCounters after_matmul = device_counters() - start;
  EXPECT_EQ(after_matmul.blas_calls, 1u);
  EXPECT_EQ(after_matmul.blas_flops, 2u * 3 * 7 * 5);
  EXPECT_EQ(after_matmul.launches, 0u);
  kernels::add(c, c, c);
  c.fill_(0.0);
  EXPECT_EQ((device_counters() - start).launches, 2u) << "a kernel and a memset";
}

// A device tensor changes dtype on its device, as the host converts (through a double; bf16 rounded to
// nearest even; integers truncated), without a trip through the host.
TEST(DeviceCounters, DtypeConversionsStayOnTheDevice) {
  const Tensor host = Tensor::from_vector<double>({5}, {1.5, -2.75, 3.0000001, 65536.5, -7.9});
  const std::vector<DType> dtypes = {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64};
  for (DType from : dtypes)
    for (DType to : dtypes) {
      const Tensor source = host.to(from);
      const Tensor on_device = source.to(Device::cuda(0));
      const DeviceCounters start = device_counters();
      const Tensor converted = on_device.to(to);
      const DeviceCounters used = device_counters() - start;
      EXPECT_EQ(used.d2h_copies + used.h2d_copies, 0u) << dtype_name(from) << " -> " << dtype_name(to);
      EXPECT_EQ(converted.device(), Device::cuda(0));
      EXPECT_EQ(converted.to(Device::cpu()).to(DType::F64).to_vector<double>(), source.to(to).to(DType::F64).to_vector<double>())
          << dtype_name(from) << " -> " << dtype_name(to);
    }
}

// A weight with a registered bf16 copy (a training step's, under --dtype bf16) enters a mixed-precision
// matmul from the copy: the same bits as rounding it for the product, one rounding launch fewer.
TEST(DeviceCounters, RegisteredBf16WeightsAreNotRoundedAgain) {
  const Tensor x = Tensor::from_vector<float>({2, 3}, {0.1f, -1.7f, 2.3f, 3.3f, 0.45f, -0.2f}).to(Device::cuda(0));
  const Tensor w = Tensor::from_vector<float>({4, 3}, {1.1f, 0.3f, -0.7f, 2.9f, -1.3f, 0.01f, 0.5f, 0.6f, 0.7f, 1.f,
                                                      -2.f, 3.f}).to(Device::cuda(0));
  const Tensor w_rows = w.narrow(1, 3);  // a view at an offset, as a parameter is a view of the flat values
  Tensor rounded_each_time = Tensor::empty({2, 3}, DType::F32, Device::cuda(0));
  Tensor from_the_copy = Tensor::empty({2, 3}, DType::F32, Device::cuda(0));
  kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
  const DeviceCounters start = device_counters();
  kernels::matmul(x, false, w_rows, true, rounded_each_time, 1.0, 0.0);
  const uint64_t launches_rounding_both = (device_counters() - start).launches;
  Tensor w16 = Tensor::empty(w.shape(), DType::BF16, Device::cuda(0));
  kernels::convert(w, w16);
  {
    const Bf16Shadow registered(w, w16);
    const DeviceCounters before = device_counters();
    kernels::matmul(x, false, w_rows, true, from_the_copy, 1.0, 0.0);
    EXPECT_EQ((device_counters() - before).launches, launches_rounding_both - 1);
  }
  kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
  EXPECT_EQ(from_the_copy.to_vector<float>(), rounded_each_time.to_vector<float>());
}

// The range check of device ids waits for the device to read back its answer, unless the ids are
// trusted (the router's own, or a batch checked on the host): then nothing waits.
TEST(DeviceCounters, TrustedDeviceIndicesSkipTheCheckThatWaits) {
  const Tensor table = Tensor::zeros({10, 4}, DType::F32, Device::cuda(0));
  const Tensor ids = Tensor::from_vector<int32_t>({3}, {1, 9, 0}).to(Device::cuda(0));
  Tensor out = Tensor::empty({3, 4}, DType::F32, Device::cuda(0));
  const DeviceCounters start = device_counters();
  kernels::gather_rows(table, ids, out);
  EXPECT_EQ((device_counters() - start).host_syncs, 1u);
  {
    const kernels::TrustedDeviceIndices trusted;
    kernels::gather_rows(table, ids, out);
  }
  EXPECT_EQ((device_counters() - start).host_syncs, 1u);
  kernels::gather_rows(table, ids, out);
  EXPECT_EQ((device_counters() - start).host_syncs, 2u) << "the scope ended";
}

// One measured step (after one warm-up step) of a config with moe-m's layers, experts and vocabulary at
// a small width (bench/moe-m-structure.json): the counts follow the structure, not the width.
Json moe_m_structure_step(kernels::MatmulPrecision precision) {
  bench::StepBenchOptions options;
  options.config = LINGTRAIN_SOURCE_DIR "/bench/moe-m-structure.json";
  options.batch = 1;
  options.seq = 32;
  options.warmup = 1;
  options.steps = 1;
  options.device = "cuda";
  options.matmul_precision = precision;
  const Json result = bench::run_step_bench(options);
  kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
  return result.at("device_per_step");
}

// The ceilings of one step of that config. Each is what the GPU path does today: lower one when a change
// takes work away, never raise one without saying why in the commit.
struct Ceilings {
  double launches, host_syncs, d2h_copies, blas_calls, allocations, driver_allocations;
};
void expect_under(const Json& counts, const Ceilings& ceilings, const char* precision) {
  SCOPED_TRACE(precision);
  std::printf("%s step: %s\n", precision, counts.dump().c_str());
  EXPECT_LE(counts.at("launches").get<double>(), ceilings.launches);
  EXPECT_LE(counts.at("host_syncs").get<double>(), ceilings.host_syncs);
  EXPECT_LE(counts.at("d2h_copies").get<double>(), ceilings.d2h_copies);
  EXPECT_LE(counts.at("blas_calls").get<double>(), ceilings.blas_calls);
  EXPECT_LE(counts.at("allocations").get<double>(), ceilings.allocations);
  EXPECT_LE(counts.at("driver_allocations").get<double>(), ceilings.driver_allocations);
}

// The step waits for the device once per MoE layer (the experts' offsets) and once at its end (every
// figure in one copy): 8 host syncs. The routed experts are one grouped cuBLAS call per product (6 per MoE
// layer, gate and up one weight), whose addresses one small kernel writes on the device; a projection
// that adds the residual stream is one cuBLASLt call, the add in its epilogue.
// Mixed precision adds at most a tenth to the launches: its bf16 operands are written by their producers,
// not rounded in passes of their own.
TEST(DeviceCounters, AMoeMStepStaysUnderItsCeilings) {
  const Json f32 = moe_m_structure_step(kernels::MatmulPrecision::F32);
  const Json bf16 = moe_m_structure_step(kernels::MatmulPrecision::BF16Inputs);
  expect_under(f32, {419, 8, 8, 162, 556, 0}, "f32");
  expect_under(bf16, {445, 8, 8, 162, 654, 0}, "bf16");
  EXPECT_LE(bf16.at("launches").get<double>(), 1.1 * f32.at("launches").get<double>());
}

}  // namespace
}  // namespace lt
