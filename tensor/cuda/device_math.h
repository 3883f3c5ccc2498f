// Math functions for the kernels, on the device and in the CPU emulation: overloads named so that a
// float argument takes the f32 function on both (an unqualified exp(float) is the f64 one on the host).
#pragma once
#include <cmath>

#include "tensor/cuda/kernels.h"

namespace lt::LT_CUDA_NAMESPACE {

__host__ __device__ inline float exponential(float x) { return expf(x); }
__host__ __device__ inline double exponential(double x) { return exp(x); }

}  // namespace lt::LT_CUDA_NAMESPACE
