// The CUDA kernels behind lt::kernels (tensor/kernels.h). lt::kernels checks the operands (shapes,
// dtypes, one device) and calls these for CUDA tensors; they run on the operands' device, on its
// default stream, and return without waiting for the GPU (copies to the host wait).
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace lt::kernels {
enum class BinaryOp;  // Add, Sub, Mul: defined in tensor/cpu/kernel_util.h
}

namespace lt::cuda {

// out[i] = a[i] op b[i % inner], f32 or f64 (tensor/cuda/elementwise.cu).
void binary(kernels::BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, int64_t inner);

// y = alpha * x + beta * y, f32 or f64; beta == 0 means y is only written (tensor/cuda/elementwise.cu).
void axpby(double alpha, const Tensor& x, double beta, Tensor& y);

// Every element of t = value converted to t's dtype (any dtype; bf16 rounds to nearest even).
void fill(Tensor& t, double value);

// c = alpha * op(a) @ op(b) + beta * c with the contract of kernels::matmul, f32 or f64, via cuBLAS.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta);

}  // namespace lt::cuda
