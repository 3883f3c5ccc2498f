// RMSNorm CUDA kernels, forward and backward, with the CPU kernels' numerics (tensor/cpu/norm.cc): the
// row statistics (sum of squares; the backward's dot product) accumulate in f64 whatever the dtype, and
// x * rstd is formed before the weight multiplies it.
//
// add_rmsnorm writes the sum of the residual stream and normalises it in the same block, so the sum is read
// back from cache. Under mixed precision the forward also writes the bf16 copy of the normalised input that
// autograd keeps, and the backward reads that copy as it is.
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
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// Normalises the row x [C] with the block's threads, writing rstd from thread 0, and y16 (or null) the
// bf16 copy of y autograd keeps for the GEMMs that read y. Each thread reads back only the columns it
// wrote, where x is the sum a fused add has just written.
template <class T>
__device__ void normalize_row(const T* x, const T* w_C, double eps, T* y, T* rstd, uint16_t* y16, int64_t C) {
  double squares = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) squares += static_cast<double>(x[j]) * static_cast<double>(x[j]);
  const T r = static_cast<T>(1.0 / sqrt(block_sum(squares) / static_cast<double>(C) + eps));
  if (threadIdx.x == 0) *rstd = r;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const T value = (x[j] * r) * w_C[j];
    y[j] = value;
    if (y16 != nullptr) y16[j] = f32_to_bf16(static_cast<float>(value));
  }
}

// x_bf16 and y_bf16 (or null) receive x and y rounded to bf16, the copies autograd keeps, in the pass
// that reads x and writes y.
template <class T>
__global__ void rmsnorm_kernel(const T* x_NC, const T* w_C, double eps, T* y_NC, T* rstd_N, uint16_t* x_bf16_NC,
                               uint16_t* y_bf16_NC, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = x_NC + n * C;
    if (x_bf16_NC != nullptr)
      for (int64_t j = threadIdx.x; j < C; j += blockDim.x) x_bf16_NC[n * C + j] = f32_to_bf16(static_cast<float>(x[j]));
    normalize_row(x, w_C, eps, y_NC + n * C, rstd_N + n, y_bf16_NC == nullptr ? nullptr : y_bf16_NC + n * C, C);
  }
}

// sum = a + b rounded to T, then normalised as rmsnorm_kernel normalises x.
template <class T>
__global__ void add_rmsnorm_kernel(const T* a_NC, const T* b_NC, const T* w_C, double eps, T* sum_NC, T* y_NC,
                                   T* rstd_N, uint16_t* sum_bf16_NC, uint16_t* y_bf16_NC, int64_t N, int64_t C) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    T* sum = sum_NC + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const T value = a_NC[n * C + j] + b_NC[n * C + j];
      sum[j] = value;
      if (sum_bf16_NC != nullptr) sum_bf16_NC[n * C + j] = f32_to_bf16(static_cast<float>(value));
    }
    normalize_row<T>(sum, w_C, eps, y_NC + n * C, rstd_N + n, y_bf16_NC == nullptr ? nullptr : y_bf16_NC + n * C, C);
  }
}

// dx = rstd g - x rstd^3 mean(g x), g = w dy; with add_to_dx, added to what dx holds. x as kept (K: T, or
// the bits of its bf16 copy, device_math.h's kept_value).
template <class T, class K>
__global__ void rmsnorm_dx_kernel(const K* x_NC, const T* w_C, const T* rstd_N, const T* dy_NC, T* dx_NC, int64_t N,
                                  int64_t C, bool add_to_dx) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const K* x = x_NC + n * C;
    const T* dy = dy_NC + n * C;
    double dot = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
      dot += static_cast<double>(w_C[j]) * static_cast<double>(dy[j]) * static_cast<double>(kept_value<T>(x, j));
    const double r = static_cast<double>(rstd_N[n]);
    const double mean_gx = block_sum(dot) / static_cast<double>(C);
    const T rt = static_cast<T>(r), coef = static_cast<T>(r * r * r * mean_gx);
    T* dx = dx_NC + n * C;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
      const T value = rt * (w_C[j] * dy[j]) - coef * kept_value<T>(x, j);
      dx[j] = add_to_dx ? value + dx[j] : value;
    }
  }
}

// dw += sum over rows of dy (x rstd), summed in T as the CPU kernel sums it.
template <class T, class K>
struct AddWeightGradTerm {
  const K* x_NC;
  const T* rstd_N;
  const T* dy_NC;
  int64_t C;
  __device__ T operator()(T sum, int64_t n, int64_t j) const {
    return sum + dy_NC[n * C + j] * (kept_value<T>(x_NC, n * C + j) * rstd_N[n]);
  }
};

template <class T>
struct AddToWeightGrad {
  T* dw_C;
  __device__ void operator()(int64_t j, T total) const { dw_C[j] += total; }
};

// The bf16 copy's bits to write, or null.
uint16_t* bf16_copy_or_null(const Tensor& copy) { return copy.defined() ? copy.bf16_data() : nullptr; }

}  // namespace

void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd, const Tensor& x_bf16,
             const Tensor& y_bf16) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  if (N == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, rmsnorm_kernel<T>)(
                      x.data<T>(), w.data<T>(), eps, y.data<T>(), rstd.data<T>(), bf16_copy_or_null(x_bf16),
                      bf16_copy_or_null(y_bf16), N, C));
  LT_CUDA_CHECK(cudaGetLastError());
}

void add_rmsnorm(const Tensor& a, const Tensor& b, const Tensor& w, double eps, Tensor& sum, Tensor& y, Tensor& rstd,
                 const Tensor& sum_bf16, const Tensor& y_bf16) {
  const int64_t C = a.dim(-1), N = a.numel() / C;
  if (N == 0) return;
  const DeviceGuard guard(a.device().index);
  LT_FLOAT_SWITCH(a.dtype(), T,
                  LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, add_rmsnorm_kernel<T>)(
                      a.data<T>(), b.data<T>(), w.data<T>(), eps, sum.data<T>(), y.data<T>(), rstd.data<T>(),
                      bf16_copy_or_null(sum_bf16), bf16_copy_or_null(y_bf16), N, C));
  LT_CUDA_CHECK(cudaGetLastError());
}

// x may be the bf16 copy of an f32 x (the front door's check_kept): read as kept, widened as it is read.
void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      bool add_to_dx) {
  const int64_t C = dy.dim(-1), N = dy.numel() / C;
  if (N == 0) return;
  const DeviceGuard guard(dy.device().index);
  LT_FLOAT_SWITCH(dy.dtype(), T, LT_KEPT_SWITCH(x, T, K, {
    const K* x_kept = static_cast<const K*>(x.raw_data());
    LT_CUDA_LAUNCH(row_blocks(N), kRowThreads, rmsnorm_dx_kernel<T, K>)
    (x_kept, w.data<T>(), rstd.data<T>(), dy.data<T>(), dx.data<T>(), N, C, add_to_dx);
    column_sums<T>(N, C, AddWeightGradTerm<T, K>{x_kept, rstd.data<T>(), dy.data<T>(), C},
                   AddToWeightGrad<T>{dw.data<T>()}, dy.device());
  }));
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
