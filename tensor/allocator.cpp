#include "tensor/allocator.h"

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tensor/device_runtime.h"
#include "tensor/error.h"

namespace lt {

CachingAllocator::~CachingAllocator() { empty_cache(); }

size_t CachingAllocator::size_class(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= 4096) return (bytes + 63) & ~size_t{63};
  // Four classes per power of two: at most 25% slack, few distinct classes.
  const int top_bit = 63 - std::countl_zero(static_cast<uint64_t>(bytes - 1));
  const size_t step = size_t{1} << (top_bit - 2);
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  void* ptr = nullptr;
  auto it = free_blocks_.find(cls);
  if (it != free_blocks_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
  } else {
    ptr = raw_alloc_(cls);
    if (ptr == nullptr) {
      // Out of memory: give the cache back and try once more before failing.
      for (auto& [size, blocks] : free_blocks_)
        for (void* block : blocks) {
          raw_free_(block);
          stats_.bytes_reserved -= size;
        }
      free_blocks_.clear();
      ptr = raw_alloc_(cls);
      if (ptr == nullptr) fail_out_of_memory(cls);
    }
    ++stats_.system_allocs;
    stats_.bytes_reserved += cls;
  }
  ++stats_.allocations;
  stats_.bytes_in_use += cls;
  if (stats_.bytes_in_use > stats_.peak_bytes_in_use) stats_.peak_bytes_in_use = stats_.bytes_in_use;
  return ptr;
}

namespace {
std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}
}  // namespace

void CachingAllocator::fail_out_of_memory(size_t bytes) const {
  std::string device_memory;
  if (memory_info_ != nullptr) {
    size_t free_bytes = 0, total_bytes = 0;
    memory_info_(&free_bytes, &total_bytes);
    device_memory = "; the device has " + gib(static_cast<double>(free_bytes)) + " free of " +
                    gib(static_cast<double>(total_bytes));
  }
  fail("out of memory on ", device_.str(), ": asked for ", gib(static_cast<double>(bytes)), " (", bytes,
       " bytes) while lingtrain holds ", gib(static_cast<double>(stats_.bytes_in_use)), " there", device_memory,
       " (a smaller --batch or --seq needs less)");
}

void CachingAllocator::release(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  const size_t cls = size_class(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.bytes_in_use -= cls;
  free_blocks_[cls].push_back(ptr);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [size, blocks] : free_blocks_)
    for (void* block : blocks) {
      raw_free_(block);
      stats_.bytes_reserved -= size;
    }
  free_blocks_.clear();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

namespace {
constexpr size_t kHostAlignment = 64;  // one AVX-512 vector, one cache line
void* host_alloc(size_t bytes) {
  return std::aligned_alloc(kHostAlignment, (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
}
void host_free(void* ptr) { std::free(ptr); }
}  // namespace

CachingAllocator& allocator_for(Device device) {
  // Leaked on purpose: tensors held in other statics may be released after this would be destroyed.
  static CachingAllocator* host = new CachingAllocator(host_alloc, host_free);
  if (device.is_cpu()) return *host;
  if constexpr (kCudaBackend) return cuda::device_allocator(device.index);
  fail("this build has no CUDA backend (nvcc was not found when it was configured)");
}

}  // namespace lt
