// A caching allocator: blocks freed by tensors go to per-size free lists and are handed out again,
// so a training step that allocates the same sizes as the one before calls the system allocator
// zero times. Sizes are rounded up to size classes (64-byte multiples when small, then four classes
// per power of two) so slightly different shapes reuse blocks. One class serves the CPU (64-byte
// aligned host memory, the widest SIMD vector) and CUDA (cudaMalloc), given two raw functions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "tensor/device.h"

namespace lt {

struct AllocatorStats {
  uint64_t allocations = 0;     // blocks handed out since start, from the cache or the system
  uint64_t system_allocs = 0;   // calls into the system allocator (the driver, on a GPU) since start
  uint64_t bytes_reserved = 0;  // held from the system (in use + cached)
  uint64_t bytes_in_use = 0;    // handed out to live tensors
  uint64_t peak_bytes_in_use = 0;
};

class CachingAllocator {
 public:
  using RawAlloc = void* (*)(size_t bytes);
  using RawFree = void (*)(void* ptr);
  // The device's free and total bytes, as the out-of-memory message reports them (nullptr: not known).
  using MemoryInfo = void (*)(size_t* free_bytes, size_t* total_bytes);

  // `device` names the memory in the out-of-memory message ("cpu", "cuda:0").
  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, Device device = Device::cpu(), MemoryInfo memory_info = nullptr)
      : raw_alloc_(raw_alloc), raw_free_(raw_free), device_(device), memory_info_(memory_info) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least `bytes` (never null). When the system says no even after the cache is
  // given back: one lt::Error line with the device, the size asked, what lingtrain holds there and, where
  // known, the device's free and total memory.
  void* allocate(size_t bytes);
  // `bytes` must be the size that was asked of allocate().
  void release(void* ptr, size_t bytes);
  // Gives every cached block back to the system.
  void empty_cache();
  AllocatorStats stats() const;

  static size_t size_class(size_t bytes);

 private:
  [[noreturn]] void fail_out_of_memory(size_t bytes) const;

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  Device device_;
  MemoryInfo memory_info_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // size class -> cached blocks
  AllocatorStats stats_;
};

CachingAllocator& allocator_for(Device device);

}  // namespace lt
