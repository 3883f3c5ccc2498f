// LT_HOST_DEVICE marks arithmetic that a CPU kernel and a CUDA kernel share, so that both run the same
// code: nvcc compiles such a function for the host and the device, every other compiler (and the CPU
// emulation of the CUDA kernels, tensor/cuda/emulation.h) sees a plain inline function.
#pragma once

#ifdef __CUDACC__
#define LT_HOST_DEVICE __host__ __device__
#else
#define LT_HOST_DEVICE
#endif
