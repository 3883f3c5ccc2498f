// The CUDA runtime as the rest of lingtrain sees it: device discovery, one caching allocator and one
// cuBLAS handle per device, synchronous copies, and the checks that turn a CUDA or cuBLAS status into
// one lt::Error line.
//
// Only compiled when LINGTRAIN_CUDA is defined. Device and CachingAllocator are only declared here, so
// the allocator and the device query can include this header without the tensor headers.
//
// Every kernel, copy and cuBLAS call runs on the legacy default stream of its device, so they execute
// in the order they were issued without explicit synchronisation.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace lt {
struct Device;
class CachingAllocator;
}  // namespace lt

namespace lt::cuda {

// Number of usable GPUs, queried once. 0 when cudaGetDeviceCount fails (error 35 without a driver)
// as well as when it reports none.
int device_count();

// "NVIDIA H100 80GB HBM3, 79.1 GiB, compute capability 9.0": what `lingtrain --version` lists.
std::string device_description(int index);

// The caching allocator of device `index` (cudaMalloc / cudaFree). An index that is not a usable
// device is an lt::Error, so creating a CUDA tensor on a machine without a GPU fails cleanly.
CachingAllocator& device_allocator(int index);

// Copies `bytes` between host and device or between devices; returns once the copy is complete.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);

// The cuBLAS handle of device `index`, created on first use.
cublasHandle_t cublas_handle(int index);

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

// LT_CUDA_LAUNCH(grid, block, kernel)(args...) is kernel<<<grid, block>>>(args...); written this way, a
// launch also compiles as plain C++ for the CPU emulation of the kernels (tensor/cuda/emulation.h).
#define LT_CUDA_LAUNCH(grid, block, ...) __VA_ARGS__<<<(grid), (block)>>>

// LT_CUDA_CHECK(cudaMalloc(&p, n)): throws lt::Error naming the call, file, line and CUDA's message.
#define LT_CUDA_CHECK(call) ::lt::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define LT_CUBLAS_CHECK(call) ::lt::cuda::check_cublas((call), #call, __FILE__, __LINE__)
