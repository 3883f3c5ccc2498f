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
  uint64_t system_allocs = 0;   // calls into the system allocator since start
  uint64_t bytes_reserved = 0;  // held from the system (in use + cached)
  uint64_t bytes_in_use = 0;    // handed out to live tensors
  uint64_t peak_bytes_in_use = 0;
};

class CachingAllocator {
 public:
  using RawAlloc = void* (*)(size_t bytes);
  using RawFree = void (*)(void* ptr);

  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free) : raw_alloc_(raw_alloc), raw_free_(raw_free) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least `bytes` (never null; throws lt::Error when the system says no).
  void* allocate(size_t bytes);
  // `bytes` must be the size that was asked of allocate().
  void release(void* ptr, size_t bytes);
  // Gives every cached block back to the system.
  void empty_cache();
  AllocatorStats stats() const;

  static size_t size_class(size_t bytes);

 private:
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // size class -> cached blocks
  AllocatorStats stats_;
};

CachingAllocator& allocator_for(Device device);

}  // namespace lt
