// What the core (Tensor, its storage and allocators, the device queries) needs of a GPU, declared here,
// below the backends, so that the core never includes one: the CUDA backend defines these functions
// (tensor/cuda/cuda_runtime.cpp, and fill and convert_dtype in tensor/cuda/elementwise.cu), and in
// lingtrain_emulated_gpu_tests the emulated GPU does (tests/cuda/emulated_gpu.cpp).
//
// Linked, not registered at start-up: the core's calls are what pull the backend's runtime object out of
// the static library, so no registration object can be left behind by the linker, and the emulated GPU
// stands in for the real one by defining the same functions first. The core calls them only inside
// `if constexpr (kCudaBackend)`: a build without the backend needs no definition (a discarded statement
// uses nothing), and no CUDA tensor can exist there to reach them.
#pragma once
#include <cstddef>
#include <string>

#include "tensor/device.h"

namespace lt {

class CachingAllocator;
class Tensor;

// Whether this build has the CUDA backend (nvcc was found when it was configured).
#ifdef LINGTRAIN_CUDA
inline constexpr bool kCudaBackend = true;
#else
inline constexpr bool kCudaBackend = false;
#endif

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

// Copies `bytes` between host and device or between devices. A copy within one device, and one from
// the host of at most kStagedCopyBytes (staged in pinned memory first), is queued in stream order and
// returns at once: the kernels after it see its result, and the caller may free `src`. Every other copy
// returns once it is complete, the host having waited for the device's queued work
// (copy_waits_for_device): to the host, because the host reads the result; a larger one from the host,
// because cudaMemcpy from pageable memory drains the stream before it stages the bytes; between
// devices, because two queues are involved.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
inline constexpr size_t kStagedCopyBytes = size_t{1} << 20;

}  // namespace lt::cuda

namespace lt {
// copy_bytes's contract: whether the host waits for the device during the copy (device_counters.h
// counts those waits).
inline bool copy_waits_for_device(Device dst, Device src, size_t bytes) {
  if (dst.is_cuda() && src == dst) return false;
  return !(dst.is_cuda() && src.is_cpu() && bytes <= cuda::kStagedCopyBytes);
}
}  // namespace lt

namespace lt::cuda {

// Every element of t (on a GPU) = value converted to t's dtype (any dtype; bf16 rounds to nearest even).
void fill(Tensor& t, double value);

// y = x's values in y's dtype, both on one GPU of the same shape, converted there as Tensor::to(DType)
// converts on the host (elementwise.cu).
void convert_dtype(const Tensor& x, Tensor& y);

}  // namespace lt::cuda
