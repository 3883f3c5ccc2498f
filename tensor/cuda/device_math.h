// Math functions for the kernels, on the device and in the CPU emulation: overloads named so that a
// float argument takes the f32 function on both (an unqualified exp(float) is the f64 one on the host).
#pragma once
#include <cmath>
#include <cstdint>

#include "tensor/cuda/kernels.h"
#include "tensor/host_device.h"

namespace lt::LT_CUDA_NAMESPACE {

__host__ __device__ inline float exponential(float x) { return expf(x); }
__host__ __device__ inline double exponential(double x) { return exp(x); }
__host__ __device__ inline float logarithm(float x) { return logf(x); }
__host__ __device__ inline double logarithm(double x) { return log(x); }

// a * b + c rounded once: what the CPU kernels' Highway MulAdd computes, written out where a kernel must
// round as they do (nvcc would otherwise choose which products to contract).
__host__ __device__ inline float fused_multiply_add(float a, float b, float c) { return fmaf(a, b, c); }
__host__ __device__ inline double fused_multiply_add(double a, double b, double c) { return fma(a, b, c); }

__host__ __device__ inline float square_root(float x) { return sqrtf(x); }
__host__ __device__ inline double square_root(double x) { return sqrt(x); }

// Element i of an activation as a backward kernel reads it where the forward kept it (autograd/saved.h):
// in the kernel's dtype T, or under mixed precision as its bf16 copy (the bits), widened exactly, which
// spares a kernel that widens the whole copy first.
template <class T>
__host__ __device__ inline T kept_value(const T* x, int64_t i) {
  return x[i];
}
template <class T>
__host__ __device__ inline T kept_value(const uint16_t* x, int64_t i) {
  return static_cast<T>(bf16_to_f32(x[i]));
}

// Writes element i of an output that only GEMMs read (a GEMM operand, autograd/saved.h): in the kernel's
// dtype T, or under mixed precision rounded to bf16 as the GEMM would round it, which spares the GEMM's
// rounding pass and half the bytes.
template <class T>
__host__ __device__ inline void store_operand(T* x, int64_t i, T value) {
  x[i] = value;
}
template <class T>
__host__ __device__ inline void store_operand(uint16_t* x, int64_t i, T value) {
  x[i] = f32_to_bf16(static_cast<float>(value));
}

}  // namespace lt::LT_CUDA_NAMESPACE

// Runs the statement with K the element type of the kept activation `kept` (kept_value above): uint16_t
// for a bf16 copy, else T.
#define LT_KEPT_SWITCH(kept, T, K, ...)       \
  do {                                        \
    if ((kept).dtype() == ::lt::DType::BF16) { \
      using K = uint16_t;                     \
      __VA_ARGS__;                            \
    } else {                                  \
      using K = T;                            \
      __VA_ARGS__;                            \
    }                                         \
  } while (0)

namespace lt::LT_CUDA_NAMESPACE {

}  // namespace lt::LT_CUDA_NAMESPACE
