// RMSNorm CUDA kernels, forward and backward, with the CPU kernels' numerics (tensor/cpu/norm.cc): the
// row statistics (sum of squares; the backward's dot product) accumulate in f64 whatever the dtype, and
// x * rstd is formed before the weight multiplies it.
//
// One block per row (a grid-stride loop over rows): its threads stride over the row's columns, then
// add their partial sums with block_sum (tensor/cuda/block_reduce.h). dw, a sum over all rows, is
// column_sums (tensor/cuda/column_sums.h): chunks of rows summed in T, then the chunks in order. Nothing
// uses atomics, so every output has the same bits run after run.
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/column_sums.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

template <class T>
__global__ void rmsnorm_kernel(const T* x_NC, const T* w_C, double eps, T* y_NC, T* rstd_N, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = x_NC + n * C;
    double squares = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) squares += static_cast<double>(x[j]) * static_cast<double>(x[j]);
    const T r = static_cast<T>(1.0 / sqrt(block_sum(squares) / static_cast<double>(C) + eps));
    if (threadIdx.x == 0) rstd_N[n] = r;
    T* y = y_NC + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) y[j] = (x[j] * r) * w_C[j];
  }
}

// dx = rstd g - x rstd^3 mean(g x), g = w dy; with add_to_dx, added to what dx holds.
template <class T>
__global__ void rmsnorm_dx_kernel(const T* x_NC, const T* w_C, const T* rstd_N, const T* dy_NC, T* dx_NC, int64_t N,
                                  int64_t C, bool add_to_dx) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = x_NC + n * C;
    const T* dy = dy_NC + n * C;
    double dot = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      dot += static_cast<double>(w_C[j]) * static_cast<double>(dy[j]) * static_cast<double>(x[j]);
    const double r = static_cast<double>(rstd_N[n]);
    const double mean_gx = block_sum(dot) / static_cast<double>(C);
    const T rt = static_cast<T>(r), coef = static_cast<T>(r * r * r * mean_gx);
    T* dx = dx_NC + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const T value = rt * (w_C[j] * dy[j]) - coef * x[j];
      dx[j] = add_to_dx ? value + dx[j] : value;
    }
  }
}

// dw += sum over rows of dy (x rstd), summed in T as the CPU kernel sums it.
template <class T>
struct AddWeightGradTerm {
  const T* x_NC;
  const T* rstd_N;
  const T* dy_NC;
  int64_t C;
  __device__ T operator()(T sum, int64_t n, int64_t j) const {
    return sum + dy_NC[n * C + j] * (x_NC[n * C + j] * rstd_N[n]);
  }
};

template <class T>
struct AddToWeightGrad {
  T* dw_C;
  __device__ void operator()(int64_t j, T total) const { dw_C[j] += total; }
};

}  // namespace

void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (N == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, rmsnorm_kernel<T>)(x.data<T>(), w.data<T>(), eps,
                                                                                 y.data<T>(), rstd.data<T>(), N, C));
  LT_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      bool add_to_dx) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (N == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, {
    LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, rmsnorm_dx_kernel<T>)
    (x.data<T>(), w.data<T>(), rstd.data<T>(), dy.data<T>(), dx.data<T>(), N, C, add_to_dx);
    column_sums<T>(N, C, AddWeightGradTerm<T>{x.data<T>(), rstd.data<T>(), dy.data<T>(), C},
                   AddToWeightGrad<T>{dw.data<T>()}, x.device());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
