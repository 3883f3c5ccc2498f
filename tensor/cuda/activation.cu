// Activation CUDA kernels: SiLU and SwiGLU, forward and backward. One thread per element in a
// grid-stride loop (tensor/cuda/grid.h); nothing is reduced, so results are deterministic. The MoE
// combine's backward with the experts' SwiGLU folded in (swiglu_combine_backward) is a row kernel: one
// block per assignment, whose dot product the block sums in a fixed order (tensor/cuda/block_reduce.h).
//
// The arithmetic is the CPU kernels' (tensor/cpu/activation.cc), in __host__ __device__ functions: the
// sigmoid comes from e = exp(-|x|), which lies in (0, 1], so a large |x| saturates to 0 or 1 instead of
// computing inf / inf. The exponentials of the two devices may differ in the last bit.
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

template <class T>
__host__ __device__ inline T sigmoid(T x) {
  const T e = exponential(x < T(0) ? x : -x);  // exp(-|x|)
  return (x >= T(0) ? T(1) : e) / (T(1) + e);
}

// d silu(x) / dx = s + x s (1 - s) = s (x (1 - s) + 1), s = sigmoid(x).
template <class T>
__host__ __device__ inline T silu_derivative(T x, T s) {
  return s * (x * (T(1) - s) + T(1));
}

template <class T>
__global__ void silu_kernel(const T* x, T* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = x[i] * sigmoid(x[i]);
}

template <class T>
__global__ void silu_backward_kernel(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dx[i] = dy[i] * silu_derivative(x[i], sigmoid(x[i]));
}

// y: T, or bf16 where only GEMMs read it (store_operand). gate16, up16 and y16, where not null, receive
// the bf16 copies autograd keeps.
template <class T, class Y>
__global__ void swiglu_kernel(const T* gate, const T* up, Y* y, uint16_t* gate16, uint16_t* up16, uint16_t* y16,
                              int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const T g = gate[i], u = up[i], out = g * sigmoid(g) * u;
    store_operand(y, i, out);
    if (gate16 != nullptr) gate16[i] = f32_to_bf16(static_cast<float>(g));
    if (up16 != nullptr) up16[i] = f32_to_bf16(static_cast<float>(u));
    if (y16 != nullptr) y16[i] = f32_to_bf16(static_cast<float>(out));
  }
}

// y = silu(g) u: dgate = dy u silu'(g), dup = dy silu(g). Gate and up as autograd kept them (KG, KU:
// T, or bf16 copies under mixed precision: kept_value).
template <class T, class KG, class KU>
__global__ void swiglu_backward_kernel(const KG* gate, const KU* up, const T* dy, T* dgate, T* dup, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const T g = kept_value<T>(gate, i), s = sigmoid(g);
    dgate[i] = dy[i] * kept_value<T>(up, i) * silu_derivative(g, s);
    dup[i] = dy[i] * (g * s);
  }
}

// Assignment a owns row pos[a] of t, h and dup and entry a of dw. Every thread of the block reaches
// block_sum, whether or not dw is wanted. Gate and up as kept (swiglu_backward_kernel); h, dup and dgate
// as GEMM operands (KH: T, or bf16 under mixed precision: store_operand), dgate over t where dgate16 is
// null.
template <class T, class KG, class KU, class KH>
__global__ void swiglu_combine_backward_kernel(const T* w, const int32_t* pos, int64_t assignments, int64_t C,
                                               const KG* gate, const KU* up, T* t, KH* h, KH* dup, T* dw,
                                               uint16_t* dgate16) {
  for (int64_t a = blockIdx.x; a < assignments; a += gridDim.x) {
    const int64_t row = static_cast<int64_t>(pos[a]) * C;
    const T weight = w[a];
    double dot = 0;
    for (int64_t c = threadIdx.x; c < C; c += kRowThreads) {
      const int64_t i = row + c;
      const T g = kept_value<T>(gate, i), u = kept_value<T>(up, i), dh = t[i];
      const T s = sigmoid(g), silu = g * s, h_m = silu * u, dy = dh * weight;
      dot += static_cast<double>(dh) * static_cast<double>(h_m);
      store_operand(h, i, h_m * weight);
      const T dgate = dy * u * silu_derivative(g, s);
      if (dgate16 != nullptr) dgate16[i] = f32_to_bf16(static_cast<float>(dgate));
      else t[i] = dgate;
      store_operand(dup, i, dy * silu);
    }
    const double total = block_sum(dot);
    if (dw != nullptr && threadIdx.x == 0) dw[a] = static_cast<T>(total);
  }
}

}  // namespace

void silu(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, silu_kernel<T>)(x.data<T>(), y.data<T>(), n));
  LT_CUDA_CHECK(cudaGetLastError());
}

void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, silu_backward_kernel<T>)(x.data<T>(), dy.data<T>(),
                                                                                          dx.data<T>(), n));
  LT_CUDA_CHECK(cudaGetLastError());
}

void swiglu(const Tensor& gate, const Tensor& up, Tensor& y, const Tensor& gate_kept, const Tensor& up_kept,
            const Tensor& y_kept) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  const DeviceGuard guard(gate.device().index);
  auto bits = [](const Tensor& kept) { return kept.defined() ? static_cast<uint16_t*>(kept.raw_data()) : nullptr; };
  LT_FLOAT_SWITCH(gate.dtype(), T, LT_KEPT_SWITCH(y, T, Y, {
                    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, swiglu_kernel<T, Y>)(
                        gate.data<T>(), up.data<T>(), static_cast<Y*>(y.raw_data()), bits(gate_kept), bits(up_kept),
                        bits(y_kept), n);
                  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup) {
  const int64_t n = dy.numel();
  if (n == 0) return;
  const DeviceGuard guard(dy.device().index);
  LT_FLOAT_SWITCH(dy.dtype(), T, LT_KEPT_SWITCH(gate, T, KG, LT_KEPT_SWITCH(up, T, KU, {
                    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, swiglu_backward_kernel<T, KG, KU>)(
                        static_cast<const KG*>(gate.raw_data()), static_cast<const KU*>(up.raw_data()), dy.data<T>(),
                        dgate.data<T>(), dup.data<T>(), n);
                  })));
  LT_CUDA_CHECK(cudaGetLastError());
}

void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate, const Tensor& up, Tensor& t,
                             Tensor& h, Tensor& dup, Tensor& dw, const Tensor& dgate_bf16) {
  const int64_t assignments = w.numel(), C = t.dim(1);
  if (assignments == 0) return;
  const DeviceGuard guard(t.device().index);
  uint16_t* dgate16 = dgate_bf16.defined() ? static_cast<uint16_t*>(dgate_bf16.raw_data()) : nullptr;
  LT_FLOAT_SWITCH(t.dtype(), T, LT_KEPT_SWITCH(gate, T, KG, LT_KEPT_SWITCH(up, T, KU, LT_KEPT_SWITCH(h, T, KH, {
                    LT_CUDA_LAUNCH(row_blocks(assignments), kRowThreads, swiglu_combine_backward_kernel<T, KG, KU, KH>)
                    (w.data<T>(), pos.data<int32_t>(), assignments, C, static_cast<const KG*>(gate.raw_data()),
                     static_cast<const KU*>(up.raw_data()), t.data<T>(), static_cast<KH*>(h.raw_data()),
                     static_cast<KH*>(dup.raw_data()), dw.defined() ? dw.data<T>() : nullptr, dgate16);
                  }))));
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
