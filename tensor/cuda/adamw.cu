// The fused AdamW step on the GPU: one thread per element of the runs to step, every run in one launch, in
// a grid-stride loop, with the arithmetic of the CPU kernel's vector path (tensor/cpu/adamw.cc) and the
// same fused multiply-adds, the bias corrections folded into scalars the host computes once (AdamWStep).
#include <cstdint>
#include <type_traits>
#include <vector>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

template <class T>
struct AdamWScalars {
  T decay, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, inv_sqrt_bc2, eps, grad_scale;
};

// Thread j of the runs' concatenation steps element begin[r] + (j - first[r]) of the run r whose first
// index is the last at or below j (a binary search of the table: runs are few, their table in cache).
// table [R, 3]: each run's begin, first index in the concatenation and whether it takes weight decay.
// p_bf16 (nullptr: none): each new value rounded to bf16, as round_to_bf16 rounds (f32 only).
template <class T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, const int64_t* table, int64_t runs, int64_t total,
                             AdamWScalars<T> s, uint16_t* p_bf16) {
  for (int64_t j = first_index(); j < total; j += grid_stride()) {
    int64_t lo = 0, hi = runs - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (table[mid * 3 + 1] <= j) lo = mid;
      else hi = mid - 1;
    }
    const int64_t i = table[lo * 3] + (j - table[lo * 3 + 1]);
    const T decay = table[lo * 3 + 2] != 0 ? s.decay : T(1);
    const T gi = g[i] * s.grad_scale;
    const T mi = fused_multiply_add(s.beta1, m[i], s.one_minus_beta1 * gi);
    const T vi = fused_multiply_add(s.beta2, v[i], s.one_minus_beta2 * (gi * gi));
    const T denom = fused_multiply_add(square_root(vi), s.inv_sqrt_bc2, s.eps);
    m[i] = mi;
    v[i] = vi;
    const T updated = p[i] * decay - (s.step_size * mi) / denom;
    p[i] = updated;
    if constexpr (std::is_same_v<T, float>)
      if (p_bf16) p_bf16[i] = f32_to_bf16(updated);
  }
}

// The runs' table on one device, copied there again only when the runs change: a training step's are the
// same every step, so steady-state steps copy nothing. Thread-local, as the RoPE tables are.
struct RunTable {
  int device = -1;
  std::vector<AdamWRun> runs;
  Tensor table;
  int64_t total = 0;
};

const RunTable& run_table(Device device, const std::vector<AdamWRun>& runs) {
  thread_local RunTable cached;
  if (cached.device == device.index && cached.runs == runs && cached.table.defined()) return cached;
  std::vector<int64_t> rows;
  int64_t total = 0;
  for (const AdamWRun& run : runs) {
    rows.insert(rows.end(), {run.begin, total, run.weight_decay ? 1 : 0});
    total += run.end - run.begin;
  }
  cached.table = Tensor::from_vector<int64_t>({static_cast<int64_t>(runs.size()), 3}, rows).to(device);
  cached.device = device.index;
  cached.runs = runs;
  cached.total = total;
  return cached;
}

}  // namespace

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const kernels::AdamWStep& step,
                const std::vector<AdamWRun>& runs, const Tensor& param_bf16) {
  const DeviceGuard guard(param.device().index);
  const std::vector<AdamWRun> stepped = kernels::stepped_runs(runs, param.numel());
  const RunTable& table = run_table(param.device(), stepped);
  if (table.total == 0) return;
  LT_FLOAT_SWITCH(param.dtype(), T, {
    // (1 - lr wd) for the runs that take weight decay; the others multiply by 1, as with wd = 0.
    const AdamWScalars<T> s{T(1.0 - step.lr * step.weight_decay),
                            T(step.beta1),
                            T(step.beta2),
                            T(1.0 - step.beta1),
                            T(1.0 - step.beta2),
                            T(step.step_size()),
                            T(step.inv_sqrt_bias_correction2()),
                            T(step.eps),
                            T(step.grad_scale)};
    LT_CUDA_LAUNCH(blocks_for(table.total), kThreadsPerBlock, adamw_kernel<T>)(
        param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), table.table.data<int64_t>(),
        static_cast<int64_t>(stepped.size()), table.total, s,
        param_bf16.defined() ? param_bf16.bf16_data() : nullptr);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
