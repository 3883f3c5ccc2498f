// What the GPU path asks of its device, counted in every process: kernel launches, the times the host
// waits for the device, copies by direction with their bytes, and GEMM calls with their FLOPs. A GPU
// step is bound by these before it is bound by arithmetic (each launch costs microseconds of host time,
// each wait drains the queue), so `lingtrain bench --device cuda` reports them per step, on a real GPU
// and on the emulated one (tests/cuda/emulated_gpu.cpp), where tests hold them under ceilings.
//
// Counted where the work is issued, so the real backend and the emulated GPU count alike: launches in
// LT_CUDA_LAUNCH (and each memset), copies and their waits in Tensor::copy_from (by the contract of
// cuda::copy_bytes in tensor/device_runtime.h), GEMM calls in the backend's GEMM entry points (cuBLAS's,
// and LT_CUDA_GEMM_LAUNCH for a GEMM kernel of our own) and not as launches. Relaxed
// atomics: counts, not an ordering, and cheap next to the microseconds a launch costs.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "tensor/device.h"

namespace lt {

struct DeviceCounters {
  uint64_t launches = 0;    // kernels and memsets queued on a device
  uint64_t host_syncs = 0;  // the host waited for a device's queued work to finish
  uint64_t d2h_copies = 0, d2h_bytes = 0;
  uint64_t h2d_copies = 0, h2d_bytes = 0;
  uint64_t d2d_copies = 0, d2d_bytes = 0;
  uint64_t blas_calls = 0;  // GEMM calls: cuBLAS, cuBLASLt, our grouped bf16 kernel; a grouped call once
  uint64_t blas_flops = 0;  // 2 M N K summed over each call's products

  // The counts of a stretch of work: the difference of two snapshots.
  DeviceCounters operator-(const DeviceCounters& earlier) const;
};

// A snapshot of this process's counts since it started.
DeviceCounters device_counters();

namespace device_count {

struct Atomics {
  std::atomic<uint64_t> launches{0}, host_syncs{0}, d2h_copies{0}, d2h_bytes{0}, h2d_copies{0}, h2d_bytes{0},
      d2d_copies{0}, d2d_bytes{0}, blas_calls{0}, blas_flops{0};
};
Atomics& atomics();

inline void launch() { atomics().launches.fetch_add(1, std::memory_order_relaxed); }
inline void host_sync() { atomics().host_syncs.fetch_add(1, std::memory_order_relaxed); }
// A copy between `src` and `dst` (at least one of them a device), with the wait that cuda::copy_bytes's
// contract implies (tensor/device_runtime.h).
void copy(Device dst, Device src, size_t bytes);
inline void blas_call(uint64_t flops) {
  atomics().blas_calls.fetch_add(1, std::memory_order_relaxed);
  atomics().blas_flops.fetch_add(flops, std::memory_order_relaxed);
}

}  // namespace device_count
}  // namespace lt
