// The MoE router and combine on the GPU. The router's rows run the CPU kernels' own code
// (tensor/moe_rows.h), one thread per token: E and k are small, and the shared code keeps the two
// backends' choices of experts identical. The combine gives each output element one thread, adding in
// the CPU's order; nothing uses atomics. (Its backward, with the experts' SwiGLU, is in activation.cu.)
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/moe_rows.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

template <class T>
__global__ void router_topk_kernel(const T* logits, int64_t N, int64_t E, int64_t k, bool renormalize, T* probs,
                                   T* lse, T* weights, int32_t* ids) {
  for (int64_t n = first_index(); n < N; n += grid_stride())
    RouterTopKRow(logits + n * E, E, k, renormalize, probs + n * E, lse + n, weights + n * k, ids + n * k);
}

template <class T>
__global__ void router_topk_backward_kernel(const T* probs, const int32_t* ids, int64_t N, int64_t E, int64_t k,
                                            bool renormalize, const T* dweights, T scale, T* dlogits) {
  for (int64_t n = first_index(); n < N; n += grid_stride())
    RouterTopKBackwardRow(probs + n * E, ids + n * k, E, k, renormalize, dweights + n * k, scale, dlogits + n * E);
}

// The upstream gradient g is read here, on the device, and joins the scales in f64 as on the CPU.
template <class T>
__global__ void router_aux_backward_kernel(const T* probs, const T* lse, const T* counts, const T* upstream, int64_t N,
                                           int64_t E, double balance_scale, double z_scale, T* dlogits) {
  const double g = static_cast<double>(upstream[0]);
  const T a = static_cast<T>(balance_scale * g), b = static_cast<T>(z_scale * g);
  for (int64_t n = first_index(); n < N; n += grid_stride())
    RouterAuxBackwardRow(probs + n * E, lse[n], counts, E, a, b, dlogits + n * E);
}

// out[n, c] = sum_j w[n, j] y[pos[n k + j], c], j in order; with add_to_out, that sum plus out[n, c].
template <class T>
__global__ void combine_rows_kernel(const T* y, const T* w, const int32_t* pos, int64_t N, int64_t k, int64_t C,
                                    bool add_to_out, T* out) {
  for (int64_t i = first_index(); i < N * C; i += grid_stride()) {
    const int64_t n = i / C, c = i % C;
    T total = w[n * k] * y[static_cast<int64_t>(pos[n * k]) * C + c];
    for (int64_t j = 1; j < k; ++j) total += w[n * k + j] * y[static_cast<int64_t>(pos[n * k + j]) * C + c];
    out[i] = add_to_out ? total + out[i] : total;
  }
}

}  // namespace

void router_topk(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& ids) {
  const int64_t N = logits.dim(0), E = logits.dim(1);
  if (N == 0) return;
  const DeviceGuard guard(logits.device().index);
  LT_FLOAT_SWITCH(logits.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(N), kThreadsPerBlock, router_topk_kernel<T>)(
        logits.data<T>(), N, E, k, renormalize, probs.data<T>(), lse.data<T>(), weights.data<T>(),
        ids.data<int32_t>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void router_topk_backward(const Tensor& probs, const Tensor& ids, bool renormalize, const Tensor& dweights,
                          double scale, Tensor& dlogits) {
  const int64_t N = probs.dim(0), E = probs.dim(1), k = ids.dim(1);
  if (N == 0) return;
  const DeviceGuard guard(probs.device().index);
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(N), kThreadsPerBlock, router_topk_backward_kernel<T>)(
        probs.data<T>(), ids.data<int32_t>(), N, E, k, renormalize, dweights.data<T>(), static_cast<T>(scale),
        dlogits.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void router_aux_backward(const Tensor& probs, const Tensor& lse, const Tensor& counts, const Tensor& upstream,
                         double balance_scale, double z_scale, Tensor& dlogits) {
  const int64_t N = probs.dim(0), E = probs.dim(1);
  if (N == 0) return;
  const DeviceGuard guard(probs.device().index);
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(N), kThreadsPerBlock, router_aux_backward_kernel<T>)(
        probs.data<T>(), lse.data<T>(), counts.data<T>(), upstream.data<T>(), N, E, balance_scale, z_scale,
        dlogits.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void combine_rows(const Tensor& y, const Tensor& w, const Tensor& pos, Tensor& out, bool add_to_out) {
  const int64_t N = w.dim(0), k = w.dim(1), C = y.dim(1);
  if (N * C == 0) return;
  const DeviceGuard guard(y.device().index);
  LT_FLOAT_SWITCH(y.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(N * C), kThreadsPerBlock, combine_rows_kernel<T>)
    (y.data<T>(), w.data<T>(), pos.data<int32_t>(), N, k, C, add_to_out, out.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
