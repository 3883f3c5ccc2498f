// The device counters (tensor/device_counters.h) on the emulated GPU: what each kind of work counts,
// and a training step with moe-m's structure held under ceilings, so that a change which adds launches,
// host waits, cuBLAS calls or driver allocations to the GPU step fails here, on a machine without one.
#include <gtest/gtest.h>

#include "bench/bench.h"
#include "tensor/device_counters.h"
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
  EXPECT_EQ(after_upload.host_syncs, 1u) << "cudaMemcpy from pageable memory drains the stream";
  Tensor copy = Tensor::empty({4}, DType::F32, Device::cuda(0));
  copy.copy_from(on_device);
  const DeviceCounters after_d2d = device_counters() - start;
  EXPECT_EQ(after_d2d.d2d_copies, 1u);
  EXPECT_EQ(after_d2d.host_syncs, 1u) << "a copy within the device is queued, not waited for";
  EXPECT_EQ(copy.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  const DeviceCounters after_read = device_counters() - start;
  EXPECT_EQ(after_read.d2h_copies, 1u);
  EXPECT_EQ(after_read.d2h_bytes, 16u);
  EXPECT_EQ(after_read.host_syncs, 2u);
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

// The routed experts are one grouped cuBLAS call per product or pair of independent products (7 per MoE
// layer) whose addresses one small kernel writes on the device (so f32 has 49 launches and 42 allocations
// more than when ~1,200 cuBLAS calls went expert by expert), and the experts' offsets come to the host
// once per MoE layer.
TEST(DeviceCounters, AMoeMStepStaysUnderItsCeilings) {
  expect_under(moe_m_structure_step(kernels::MatmulPrecision::F32), {1150, 138, 136, 193, 939, 0}, "f32");
  expect_under(moe_m_structure_step(kernels::MatmulPrecision::BF16Inputs), {1751, 138, 136, 193, 1543, 0}, "bf16");
}

}  // namespace
}  // namespace lt
