// LT_HOST_DEVICE marks arithmetic that a CPU kernel and a CUDA kernel share, so that both run the same
// code: nvcc compiles such a function for the host and the device, every other compiler (and the CPU
// emulation of the CUDA kernels, tensor/cuda/emulation.h) sees a plain inline function.
#pragma once

#ifdef __CUDACC__
#define LT_HOST_DEVICE __host__ __device__
#else
#define LT_HOST_DEVICE
#endif

namespace lt {

// a * b + c with the product rounded before the sum, as the CPU kernels' plain loops compute it (built
// without FMA instructions); nvcc would otherwise contract it into one FMA, which rounds once and gives
// other bits (and, in a difference of nearly equal terms such as a variance, a residue where the CPU has 0).
LT_HOST_DEVICE inline double multiply_then_add(double a, double b, double c) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(__dmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

}  // namespace lt
