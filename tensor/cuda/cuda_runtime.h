// The CUDA runtime as the rest of lingtrain sees it: device discovery, one caching allocator and one
// cuBLAS handle per device, synchronous copies, and the checks that turn a CUDA or cuBLAS status into
// one lt::Error line. The part the core calls (device discovery, allocators, copies) is declared in the
// core, in tensor/device_runtime.h; this header adds what the backend's kernels and the layers above use.
//
// Only compiled when LINGTRAIN_CUDA is defined.
//
// Every kernel, copy and cuBLAS call runs on the legacy default stream of its device, so they execute
// in the order they were issued without explicit synchronisation.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "tensor/device_counters.h"
#include "tensor/device_runtime.h"

namespace lt::cuda {

// The cuBLAS handle of device `index`, created on first use.
cublasHandle_t cublas_handle(int index);
// The cuBLASLt handle of device `index` and its workspace (kLtWorkspaceBytes), created on first use.
struct LtDevice {
  cublasLtHandle_t handle;
  void* workspace;
};
inline constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;
LtDevice cublaslt_device(int index);

// Makes `index` the current device for the guard's lifetime, then restores the previous one, so a
// call never leaves the caller on a different device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

[[noreturn]] void fail_cuda(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t status, const char* call, const char* file, int line);

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) fail_cuda(status, call, file, line);
}
inline void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) fail_cublas(status, call, file, line);
}

}  // namespace lt::cuda

// LT_CUDA_LAUNCH(grid, block, kernel)(args...) is kernel<<<grid, block>>>(args...), counted
// (tensor/device_counters.h); written this way, a launch also compiles as plain C++ for the CPU
// emulation of the kernels (tensor/cuda/emulation.h).
#define LT_CUDA_LAUNCH(grid, block, ...) ::lt::device_count::launch(), __VA_ARGS__<<<(grid), (block)>>>
// The same for a kernel that is a GEMM (tensor/cuda/grouped_gemm_bf16.cu): counted as a GEMM call of
// `flops`, beside cuBLAS's, not as a launch.
#define LT_CUDA_GEMM_LAUNCH(flops, grid, block, ...) \
  ::lt::device_count::blas_call(flops), __VA_ARGS__<<<(grid), (block)>>>

// Zeroes `bytes` at `data` on the stream, counted as a launch.
#define LT_CUDA_ZERO_ASYNC(data, bytes) \
  (::lt::device_count::launch(), LT_CUDA_CHECK(cudaMemsetAsync((data), 0, (bytes), nullptr)))

// LT_CUDA_CHECK(cudaMalloc(&p, n)): throws lt::Error naming the call, file, line and CUDA's message.
#define LT_CUDA_CHECK(call) ::lt::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define LT_CUBLAS_CHECK(call) ::lt::cuda::check_cublas((call), #call, __FILE__, __LINE__)
