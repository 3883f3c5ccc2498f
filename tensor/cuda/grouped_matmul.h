// The definitions of lt::cuda::grouped_matmul and grouped_weight_grad: one lt::cuda::matmul per expert
// segment (tensor/grouped_gemm.h) at the run's precision. Included by exactly one file of a program:
// tensor/cuda/gemm.cu, or tests/cuda/emulated_gpu.cpp where that stands in for the backend.
#pragma once
#include "tensor/cuda/kernels.h"
#include "tensor/grouped_gemm.h"

namespace lt::cuda {

void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& host_offsets, Tensor& out,
                    double beta, MatmulPrecision precision) {
  grouped_matmul_by_segments(a, w, trans_w, host_offsets.data<int64_t>(), out, beta, precision, matmul);
}

void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& host_offsets, Tensor& dw, double beta,
                         MatmulPrecision precision) {
  grouped_weight_grad_by_segments(a, b, host_offsets.data<int64_t>(), dw, beta, precision, matmul);
}

}  // namespace lt::cuda
