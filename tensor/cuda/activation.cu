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

// gate_up: rows of [gate (C) | up (C)]; element i of y (row i / C, column i % C) reads its gate and up
// there. y: T, or bf16 where only GEMMs read it (store_operand). gate_up16 and y16, where not null, receive
// the bf16 copies autograd keeps.
template <class T, class Y>
__global__ void swiglu_kernel(const T* gate_up, Y* y, uint16_t* gate_up16, uint16_t* y16, int64_t n, int64_t C) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t row = i / C, at = i + row * C;  // gate's index in gate_up; up's is C on
    const T g = gate_up[at], u = gate_up[at + C], out = g * sigmoid(g) * u;
    store_operand(y, i, out);
    if (gate_up16 != nullptr) {
      gate_up16[at] = f32_to_bf16(static_cast<float>(g));
      gate_up16[at + C] = f32_to_bf16(static_cast<float>(u));
    }
    if (y16 != nullptr) y16[i] = f32_to_bf16(static_cast<float>(out));
  }
}

// y = silu(g) u: dgate = dy u silu'(g), dup = dy silu(g), into dgate_up's halves. gate_up as autograd kept
// it (K: T, or its bf16 copy under mixed precision: kept_value); dgate_up as a GEMM operand (D: T, or bf16
// under mixed precision: store_operand).
template <class T, class K, class D>
__global__ void swiglu_backward_kernel(const K* gate_up, const T* dy, D* dgate_up, int64_t n, int64_t C) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t at = i + (i / C) * C;
    const T g = kept_value<T>(gate_up, at), u = kept_value<T>(gate_up, at + C), s = sigmoid(g);
    store_operand(dgate_up, at, dy[i] * u * silu_derivative(g, s));
    store_operand(dgate_up, at + C, dy[i] * (g * s));
  }
}

// Assignment a owns row pos[a] of h and dgate_up and entry a of dw. Every thread of the block reaches
// block_sum, whether or not dw is wanted. gate_up as kept (swiglu_backward_kernel); h and dgate_up as GEMM
// operands (KH: T, or bf16 under mixed precision: store_operand).
template <class T, class K, class KH>
__global__ void swiglu_combine_backward_kernel(const T* w, const int32_t* pos, int64_t assignments, int64_t C,
                                               const K* gate_up, const T* t, KH* h, KH* dgate_up, T* dw) {
  for (int64_t a = blockIdx.x; a < assignments; a += gridDim.x) {
    const int64_t m = pos[a], row = m * C, gate_row = 2 * m * C;
    const T weight = w[a];
    double dot = 0;
    for (int64_t c = threadIdx.x; c < C; c += kRowThreads) {
      const T g = kept_value<T>(gate_up, gate_row + c), u = kept_value<T>(gate_up, gate_row + C + c), dh = t[row + c];
      const T s = sigmoid(g), silu = g * s, h_m = silu * u, dy = dh * weight;
      dot += static_cast<double>(dh) * static_cast<double>(h_m);
      store_operand(h, row + c, h_m * weight);
      store_operand(dgate_up, gate_row + c, dy * u * silu_derivative(g, s));
      store_operand(dgate_up, gate_row + C + c, dy * silu);
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

void swiglu(const Tensor& gate_up, Tensor& y, const Tensor& gate_up_kept, const Tensor& y_kept) {
  const int64_t n = y.numel(), C = y.dim(-1);
  if (n == 0) return;
  const DeviceGuard guard(gate_up.device().index);
  auto bits = [](const Tensor& kept) { return kept.defined() ? static_cast<uint16_t*>(kept.raw_data()) : nullptr; };
  LT_FLOAT_SWITCH(gate_up.dtype(), T, LT_KEPT_SWITCH(y, T, Y, {
                    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, swiglu_kernel<T, Y>)(
                        gate_up.data<T>(), static_cast<Y*>(y.raw_data()), bits(gate_up_kept), bits(y_kept), n, C);
                  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const Tensor& gate_up, const Tensor& dy, Tensor& dgate_up) {
  const int64_t n = dy.numel(), C = dy.dim(-1);
  if (n == 0) return;
  const DeviceGuard guard(dy.device().index);
  LT_FLOAT_SWITCH(dy.dtype(), T, LT_KEPT_SWITCH(gate_up, T, K, LT_KEPT_SWITCH(dgate_up, T, D, {
                    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, swiglu_backward_kernel<T, K, D>)(
                        static_cast<const K*>(gate_up.raw_data()), dy.data<T>(), static_cast<D*>(dgate_up.raw_data()),
                        n, C);
                  })));
  LT_CUDA_CHECK(cudaGetLastError());
}

void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate_up, const Tensor& t, Tensor& h,
                             Tensor& dgate_up, Tensor& dw) {
  const int64_t assignments = w.numel(), C = t.dim(1);
  if (assignments == 0) return;
  const DeviceGuard guard(t.device().index);
  LT_FLOAT_SWITCH(t.dtype(), T, LT_KEPT_SWITCH(gate_up, T, K, LT_KEPT_SWITCH(h, T, KH, {
                    LT_CUDA_LAUNCH(row_blocks(assignments), kRowThreads, swiglu_combine_backward_kernel<T, K, KH>)
                    (w.data<T>(), pos.data<int32_t>(), assignments, C, static_cast<const K*>(gate_up.raw_data()),
                     t.data<T>(), static_cast<KH*>(h.raw_data()), static_cast<KH*>(dgate_up.raw_data()),
                     dw.defined() ? dw.data<T>() : nullptr);
                  })));
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
