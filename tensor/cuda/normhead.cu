// NormHead's column scale on the GPU: inv_norm[j] = 1 / (sqrt(sum_v w[v, j]^2) + eps) for the head
// w [V, H]. One thread per column adds the squares in f64 in row order, as the CPU kernel
// (tensor/cpu/normhead.cc) does, so both backends give the same bits; the threads of a warp read
// neighbouring columns of one row, so each row is read in coalesced runs.
#include <cmath>
#include <cstdint>

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
__global__ void column_inv_norm_kernel(const T* w_VH, T* inv_norm_H, int64_t V, int64_t H, double eps) {
  for (int64_t j = first_index(); j < H; j += grid_stride()) {
    double squares = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double w = static_cast<double>(w_VH[v * H + j]);
      squares = multiply_then_add(w, w, squares);
    }
    inv_norm_H[j] = static_cast<T>(1.0 / (sqrt(squares) + eps));
  }
}

}  // namespace

void column_inv_norm(const Tensor& w, double eps, Tensor& inv_norm) {
  const int64_t V = w.dim(0), H = w.dim(1);
  if (H == 0) return;
  const DeviceGuard guard(w.device().index);
  LT_FLOAT_SWITCH(w.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(H), kThreadsPerBlock, column_inv_norm_kernel<T>)(
        w.data<T>(), inv_norm.data<T>(), V, H, eps);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
