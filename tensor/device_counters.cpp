#include "tensor/device_counters.h"

#include "tensor/device_runtime.h"

namespace lt {

DeviceCounters DeviceCounters::operator-(const DeviceCounters& earlier) const {
  return {launches - earlier.launches,     host_syncs - earlier.host_syncs, d2h_copies - earlier.d2h_copies,
          d2h_bytes - earlier.d2h_bytes,   h2d_copies - earlier.h2d_copies, h2d_bytes - earlier.h2d_bytes,
          d2d_copies - earlier.d2d_copies, d2d_bytes - earlier.d2d_bytes,   blas_calls - earlier.blas_calls,
          blas_flops - earlier.blas_flops};
}

namespace device_count {
Atomics& atomics() {
  static Atomics counts;
  return counts;
}

void copy(Device dst, Device src, size_t bytes) {
  Atomics& a = atomics();
  const auto add = [](std::atomic<uint64_t>& v, uint64_t n) { v.fetch_add(n, std::memory_order_relaxed); };
  if (dst.is_cpu()) {
    add(a.d2h_copies, 1);
    add(a.d2h_bytes, bytes);
  } else if (src.is_cpu()) {
    add(a.h2d_copies, 1);
    add(a.h2d_bytes, bytes);
  } else {
    add(a.d2d_copies, 1);
    add(a.d2d_bytes, bytes);
  }
  if (copy_waits_for_device(dst, src, bytes)) host_sync();
}
}  // namespace device_count

DeviceCounters device_counters() {
  const device_count::Atomics& a = device_count::atomics();
  auto get = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  return {get(a.launches),   get(a.host_syncs), get(a.d2h_copies), get(a.d2h_bytes),  get(a.h2d_copies),
          get(a.h2d_bytes),  get(a.d2d_copies), get(a.d2d_bytes),  get(a.blas_calls), get(a.blas_flops)};
}

}  // namespace lt
