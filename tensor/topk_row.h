// The top-k selection of one row, shared by kernels::topk and the fused router on the CPU
// (tensor/cpu/index.cc, tensor/cpu/moe.cc) and by their CUDA kernels (tensor/cuda/index.cu), which run
// this same code one row per thread.
#pragma once
#include <cstdint>

#include "tensor/host_device.h"

namespace lt {

// The ranking of top-k: larger values first, NaN above everything (as torch.topk does, so a diverged
// router shows up in the selection instead of being silently skipped), equal values by lower index.
// Candidates arrive in index order, so "ranks above" only needs the value: a later equal value never
// displaces an earlier one. (v != v is the NaN test that host and device compilers both provide.)
template <class T>
LT_HOST_DEVICE inline bool RanksAbove(T candidate, T kept) {
  if (candidate != candidate) return kept == kept;
  return candidate > kept;
}

// The k best of row[0, cols) in descending order, kept as a sorted list updated by insertion:
// O(cols * k), which for a router (E up to a few hundred, k up to ~8) beats a heap or a full sort.
template <class T>
LT_HOST_DEVICE inline void TopKRow(const T* row, int64_t cols, int64_t k, T* best_values, int32_t* best_indices) {
  int64_t count = 0;
  for (int64_t e = 0; e < cols; ++e) {
    const T v = row[e];
    if (count == k && !RanksAbove(v, best_values[k - 1])) continue;
    int64_t pos = count < k - 1 ? count : k - 1;
    while (pos > 0 && RanksAbove(v, best_values[pos - 1])) {
      best_values[pos] = best_values[pos - 1];
      best_indices[pos] = best_indices[pos - 1];
      --pos;
    }
    best_values[pos] = v;
    best_indices[pos] = static_cast<int32_t>(e);
    count = count + 1 < k ? count + 1 : k;
  }
}

}  // namespace lt
