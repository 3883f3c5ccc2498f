// The CUDA backend: the kernels behind the front doors of tensor/kernels/<family>.cpp, a peer of the
// CPU backend (tensor/cpu/kernels.h). Each kernel has the contract of its front door (tensor/kernels.def,
// where its signature is written once for the front door and both backends) and checks nothing: the
// front door has checked shapes, dtypes and that every operand is on one device. They run on that
// device's default stream and return without waiting for the GPU (copies to the host wait).
//
// Declared whether or not the backend is compiled: the front doors call these only inside
// `if constexpr (kCudaBackend)` (tensor/device_runtime.h), so a build without nvcc needs no definition.
//
// Adding a CUDA kernel: one .cu file (its device code and the Tensor-level function that launches it),
// its line in tensor/kernels.def (or its declaration here, for one that only this backend has), the CUDA
// branch in its front door, and one entry in cuda_cases() of tests/cuda/test_cuda.cpp, which compares it
// with the CPU kernel on a GPU. Launched through LT_CUDA_LAUNCH and without cuBLAS, the kernel also runs
// on the CPU through tensor/cuda/emulation.h: its .cu file goes into tests/cuda/test_cuda_emulation.cpp,
// which compares it with the CPU kernel here.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

// lt::cuda, or lt::cuda_emulated when a test compiles a .cu file as plain C++ (tensor/cuda/emulation.h).
#ifndef LT_CUDA_NAMESPACE
#define LT_CUDA_NAMESPACE cuda
#endif

namespace lt::LT_CUDA_NAMESPACE {

using kernels::AdamWStep;
using kernels::BinaryOp;
using kernels::IndexRange;
using kernels::MatmulPrecision;
using kernels::OutOfRange;

#include "tensor/backend_kernels.inc"

// What only the CUDA backend has. fill, which Tensor::fill_ calls, is declared below the backends, in
// tensor/device_runtime.h.

// The head dims the attention kernels take, up to this (the front door checks; attention.cu).
inline constexpr int64_t kMaxAttentionHeadDim = 128;

// The first id of `ids` (i32 or i64) that `range` does not allow, found on the device and read back:
// the one call here that waits for the GPU, which a front door makes before it lets ids address memory
// (index.cu).
OutOfRange first_out_of_range(const Tensor& ids, const IndexRange& range);

// packed (a device tensor of at least packed_bytes(sources) bytes) = the bytes of every source, each at
// the next multiple of 8 bytes (slice.cu): one launch per kPackSources sources.
void pack_bytes(const std::vector<Tensor>& sources, Tensor& packed);
inline constexpr int kPackSources = 32;

// The grouped GEMMs over a dispatch's segments, via cuBLAS (gemm.cu); host_offsets is the front door's
// host copy of the segment offsets.
void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& host_offsets, Tensor& out,
                    double beta, MatmulPrecision precision);
void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& host_offsets, Tensor& dw, double beta,
                         MatmulPrecision precision);

// c = alpha * op(a) @ op(b) + beta * c with the contract of kernels::matmul, f32 or f64, via cuBLAS;
// with BF16Inputs, f32 operands are rounded to bf16 (round_to_bf16) and multiplied on the tensor cores
// with f32 accumulation.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision);

// y (bf16) = x (f32) rounded to nearest even, element by element (elementwise.cu).
void round_to_bf16(const Tensor& x, Tensor& y);
// x (f32) as a bf16 operand of a mixed-precision GEMM: its registered rounded copy where it has one (a
// weight during a training step: tensor/bf16_shadow.h), else rounded here into a new tensor.
Tensor bf16_operand(const Tensor& x);
// y (f32) = x (bf16), exactly (elementwise.cu).
void widen_bf16(const Tensor& x, Tensor& y);

}  // namespace lt::LT_CUDA_NAMESPACE
