// NormHead's column scale on the GPU: inv_norm[j] = 1 / (sqrt(sum_v w[v, j]^2) + eps) for the head
// w [V, H]. The squares are added in f64 by column_sums (tensor/cuda/column_sums.h), in the chunked row
// order the CPU kernel (tensor/cpu/normhead.cc) shares, each square rounded before its addition as the
// CPU's loop rounds it, so both backends give the same bits.
#include <cmath>
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/column_sums.h"
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

template <class T>
struct AddSquare {
  const T* w_VH;
  int64_t H;
  __device__ double operator()(double sum, int64_t v, int64_t j) const {
    const double w = static_cast<double>(w_VH[v * H + j]);
    return multiply_then_add(w, w, sum);
  }
};

template <class T>
struct WriteInvNorm {
  T* inv_norm_H;
  double eps;
  __device__ void operator()(int64_t j, double squares) const {
    inv_norm_H[j] = static_cast<T>(1.0 / (sqrt(squares) + eps));
  }
};

}  // namespace

void column_inv_norm(const Tensor& w, double eps, Tensor& inv_norm) {
  const int64_t V = w.dim(0), H = w.dim(1);
  const DeviceGuard guard(w.device().index);
  LT_FLOAT_SWITCH(w.dtype(), T,
                  column_sums<double>(V, H, AddSquare<T>{w.data<T>(), H}, WriteInvNorm<T>{inv_norm.data<T>(), eps},
                                      w.device()));
}

}  // namespace lt::LT_CUDA_NAMESPACE
