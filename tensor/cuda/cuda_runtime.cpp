// Device discovery, per-device allocators and cuBLAS handles, and copies (the error reports: cuda_errors.cpp).
// CMake globs every .cpp under tensor/ into the library, CUDA or not, hence the guard.
#ifdef LINGTRAIN_CUDA
#include "tensor/cuda/cuda_runtime.h"

#include <cstdio>
#include <string>

#include <array>
#include <cstring>
#include <mutex>
#include <utility>

#include "tensor/allocator.h"
#include "tensor/device.h"
#include "tensor/error.h"

namespace lt::cuda {

int device_count() {
  static const int count = [] {
    int n = 0;
    // Without a driver this returns error 35 (insufficient driver) and leaves n untouched; the error
    // also sticks as the last error, which would then surface in the next unrelated check.
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

std::string device_description(int index) {
  cudaDeviceProp props{};
  LT_CUDA_CHECK(cudaGetDeviceProperties(&props, index));
  char memory[32];
  std::snprintf(memory, sizeof memory, "%.1f GiB", static_cast<double>(props.totalGlobalMem) / (1 << 30));
  return std::string(props.name) + ", " + memory + ", compute capability " + std::to_string(props.major) + "." +
         std::to_string(props.minor);
}

DeviceGuard::DeviceGuard(int index) {
  LT_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != index) {
    LT_CUDA_CHECK(cudaSetDevice(index));
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; switching back to a device that was current a moment ago only fails
  // when the driver itself is gone, and then the next checked call reports it.
  if (switched_) cudaSetDevice(previous_);
}

namespace {

// CachingAllocator takes plain function pointers with no context, so each device gets its own
// instantiation of these, up to a fixed number of devices per process.
constexpr int kMaxDevices = 16;

void check_device_index(int index) {
  const int count = device_count();
  LT_CHECK(index >= 0 && index < count, "cuda:", index, " is not a usable device: this machine has ", count,
           " CUDA device(s)");
  LT_CHECK(index < kMaxDevices, "cuda:", index, ": lingtrain supports at most ", kMaxDevices,
           " devices per process");
}

template <int kDevice>
void* device_malloc(size_t bytes) {
  const DeviceGuard guard(kDevice);
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    // Not fatal: the caching allocator frees its cache and tries once more.
    cudaGetLastError();
    return nullptr;
  }
  LT_CUDA_CHECK(status);
  return ptr;
}

template <int kDevice>
void device_free(void* ptr) {
  const DeviceGuard guard(kDevice);
  LT_CUDA_CHECK(cudaFree(ptr));
}

template <int kDevice>
void device_memory(size_t* free_bytes, size_t* total_bytes) {
  const DeviceGuard guard(kDevice);
  if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
    cudaGetLastError();
    *free_bytes = *total_bytes = 0;
  }
}

template <int... kDevices>
CachingAllocator* make_allocator(int index, std::integer_sequence<int, kDevices...>) {
  constexpr std::array<CachingAllocator::RawAlloc, sizeof...(kDevices)> allocs{&device_malloc<kDevices>...};
  constexpr std::array<CachingAllocator::RawFree, sizeof...(kDevices)> frees{&device_free<kDevices>...};
  constexpr std::array<CachingAllocator::MemoryInfo, sizeof...(kDevices)> infos{&device_memory<kDevices>...};
  return new CachingAllocator(allocs[index], frees[index], Device::cuda(index), infos[index]);
}

}  // namespace

CachingAllocator& device_allocator(int index) {
  check_device_index(index);
  // Leaked on purpose, like the host allocator: tensors held in other statics may be released after
  // these would be destroyed, and cudaFree after the runtime has shut down fails.
  static std::mutex mutex;
  static std::array<CachingAllocator*, kMaxDevices> allocators{};
  const std::lock_guard<std::mutex> lock(mutex);
  if (allocators[index] == nullptr)
    allocators[index] = make_allocator(index, std::make_integer_sequence<int, kMaxDevices>{});
  return *allocators[index];
}

cublasHandle_t cublas_handle(int index) {
  check_device_index(index);
  // Leaked on purpose: destroying a handle during static destruction races the runtime's own teardown.
  // The default math mode keeps f32 GEMMs in full f32 (no TF32), so they match the CPU kernels.
  static std::mutex mutex;
  static std::array<cublasHandle_t, kMaxDevices> handles{};
  const std::lock_guard<std::mutex> lock(mutex);
  if (handles[index] == nullptr) {
    const DeviceGuard guard(index);
    LT_CUBLAS_CHECK(cublasCreate(&handles[index]));
  }
  return handles[index];
}

LtDevice cublaslt_device(int index) {
  check_device_index(index);
  // Leaked on purpose, as the cuBLAS handle. The workspace comes from the driver once per device, outside the
  // caching allocator (which never sees it, so no step's figures count it).
  static std::mutex mutex;
  static std::array<LtDevice, kMaxDevices> devices{};
  const std::lock_guard<std::mutex> lock(mutex);
  LtDevice& device = devices[index];
  if (device.handle == nullptr) {
    const DeviceGuard guard(index);
    LT_CUBLAS_CHECK(cublasLtCreate(&device.handle));
    LT_CUDA_CHECK(cudaMalloc(&device.workspace, kLtWorkspaceBytes));
  }
  return device;
}

namespace {

// Host-to-device copies of up to kStagedCopyBytes go through pinned staging slots, so they are queued
// like kernels (cudaMemcpy from pageable memory would first wait for everything queued: the next
// step's batch would wait for the last step's AdamW). The bytes are staged before the call returns, so
// the caller may free `src` at once. A slot is reused once the event recorded after its copy has passed:
// with kStagingSlots slots that is long done, unless the host runs that far ahead of the device.
class StagingRing {
 public:
  void copy(int device, void* dst, const void* src, size_t bytes) {
    Slot& slot = slots_[device][next_[device]];
    next_[device] = (next_[device] + 1) % kStagingSlots;
    if (slot.host == nullptr) {
      LT_CUDA_CHECK(cudaMallocHost(&slot.host, kStagedCopyBytes));
      LT_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
    } else {
      const cudaError_t state = cudaEventQuery(slot.done);
      if (state == cudaErrorNotReady) {
        cudaGetLastError();  // "not ready" is an answer, not an error for a later check to report
        device_count::host_sync();
        LT_CUDA_CHECK(cudaEventSynchronize(slot.done));
      } else {
        LT_CUDA_CHECK(state);
      }
    }
    std::memcpy(slot.host, src, bytes);
    LT_CUDA_CHECK(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, nullptr));
    LT_CUDA_CHECK(cudaEventRecord(slot.done, nullptr));
  }

 private:
  static constexpr int kStagingSlots = 8;
  struct Slot {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
  };
  std::array<std::array<Slot, kStagingSlots>, kMaxDevices> slots_{};
  std::array<int, kMaxDevices> next_{};
};

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    check_device_index(dst_device.index);
    check_device_index(src_device.index);
    LT_CUDA_CHECK(cudaMemcpyPeer(dst, dst_device.index, src, src_device.index, bytes));
    // cudaMemcpyPeer is ordered after earlier work on both devices but returns before it completes.
    const DeviceGuard guard(dst_device.index);
    LT_CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  const Device active = dst_device.is_cuda() ? dst_device : src_device;
  check_device_index(active.index);
  const DeviceGuard guard(active.index);
  if (src_device.is_cpu() && bytes <= kStagedCopyBytes) {
    // Leaked on purpose, like the allocators: pinned memory freed after the runtime's teardown fails.
    static StagingRing* const staging = new StagingRing;
    static std::mutex mutex;
    const std::lock_guard<std::mutex> lock(mutex);
    staging->copy(active.index, dst, src, bytes);
  } else if (src_device.is_cpu()) {
    // Pageable host memory is staged before this returns, so the caller may free `src` at once.
    LT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  } else if (dst_device.is_cpu()) {
    LT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  } else {
    // Queued on the legacy default stream, like the kernels: those issued after it read its result.
    LT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
  }
}

}  // namespace lt::cuda
#endif  // LINGTRAIN_CUDA
