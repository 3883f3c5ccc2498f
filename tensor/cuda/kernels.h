// The CUDA backend: the kernels behind the front doors of tensor/kernels/<family>.cpp, a peer of the
// CPU backend (tensor/cpu/kernels.h). Each function has the contract of the lt::kernels function it
// serves (tensor/kernels.h) and checks nothing: the front door has checked shapes, dtypes and that
// every operand is on one device. They run on that device's default stream and return without waiting
// for the GPU (copies to the host wait).
//
// Declared whether or not the backend is compiled: the front doors call these only inside
// `if constexpr (kCudaBackend)` (tensor/kernels/dispatch.h), so a build without nvcc needs no definition.
//
// Adding a CUDA kernel: one .cu file (its device code and the Tensor-level function that launches it),
// the function's declaration here, the CUDA branch in its front door, and one entry in cuda_cases() of
// tests/cuda/test_cuda.cpp, which compares it with the CPU kernel on a GPU. Launched through
// LT_CUDA_LAUNCH and without cuBLAS, the kernel also runs on the CPU through tensor/cuda/emulation.h:
// its .cu file goes into tests/cuda/test_cuda_emulation.cpp, which compares it with the CPU kernel here.
#pragma once
#include <cstdint>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

// lt::cuda, or lt::cuda_emulated when a test compiles a .cu file as plain C++ (tensor/cuda/emulation.h).
#ifndef LT_CUDA_NAMESPACE
#define LT_CUDA_NAMESPACE cuda
#endif

namespace lt::LT_CUDA_NAMESPACE {

using kernels::BinaryOp;

// out[i] = a[i] op b[i % inner], f32 or f64 (elementwise.cu).
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, int64_t inner);

// y = alpha * x + beta * y, f32 or f64; beta == 0 means y is only written (elementwise.cu).
void axpby(double alpha, const Tensor& x, double beta, Tensor& y);

// Every element of t = value converted to t's dtype (any dtype; bf16 rounds to nearest even).
void fill(Tensor& t, double value);

// SiLU and SwiGLU (silu(gate) * up), forward and backward, f32 or f64 (activation.cu).
void silu(const Tensor& x, Tensor& y);
void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup);

// RMSNorm over the last dim C, forward and backward (dw accumulated into), f32 or f64 (norm.cu).
void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd);
void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw);

// Softmax and log-softmax over the last dimension, forward and backward, f32 or f64 (softmax.cu).
void softmax(const Tensor& x, Tensor& y);
void log_softmax(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

// One AdamW step over a flat parameter, in place, f32 or f64 (adamw.cu).
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const kernels::AdamWStep& step);

// c = alpha * op(a) @ op(b) + beta * c with the contract of kernels::matmul, f32 or f64, via cuBLAS.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta);

}  // namespace lt::LT_CUDA_NAMESPACE
