// The definitions of lt::cuda::grouped_matmul and grouped_weight_grad: one lt::cuda::matmul per expert
// segment (tensor/grouped_gemm.h) at the run's precision. Included by exactly one file of a program:
// tensor/cuda/gemm.cu, or tests/cuda/emulated_gpu.cpp where that stands in for the backend.
#pragma once
#include "tensor/cuda/kernels.h"
#include "tensor/grouped_gemm.h"

namespace lt::cuda {
namespace {

// cuBLAS reads whole matrices: the front door gathers an operand by row before it reaches here.
void matmul_in_order(const Tensor& a, const Tensor& a_rows, bool trans_a, const Tensor& b, const Tensor& b_rows,
                     bool trans_b, Tensor& c, double alpha, double beta, MatmulPrecision precision) {
  LT_CHECK(!a_rows.defined() && !b_rows.defined(), "cuda grouped matmul: operands gathered by row reach the device");
  matmul(a, trans_a, b, trans_b, c, alpha, beta, precision);
}

}  // namespace

void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& host_offsets, Tensor& out,
                    double beta, MatmulPrecision precision) {
  grouped_matmul_by_segments({a, w, trans_w, out, beta}, host_offsets.data<int64_t>(), precision, matmul_in_order);
}

void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& host_offsets, Tensor& dw, double beta,
                         MatmulPrecision precision) {
  grouped_weight_grad_by_segments({a, b, dw, beta}, host_offsets.data<int64_t>(), precision, matmul_in_order);
}

}  // namespace lt::cuda
