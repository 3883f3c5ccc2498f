// Raw launchers of the elementwise kernels in tensor/cuda/elementwise.cu. They take pointers, not
// Tensors, because nvcc compiles C++17 and cannot read the C++20 tensor headers; the Tensor-level
// functions of tensor/cuda/kernels.h unwrap the operands and call these.
//
// Each launches on the current device's legacy default stream (set by the caller) and returns without
// waiting; a launch error becomes an lt::Error. n == 0 launches nothing.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lt::cuda {

// out[i] = a[i] op b[i % inner] for i < n. out may be a or b. Instantiated for float and double.
template <class T>
void launch_add(const T* a, const T* b, T* out, int64_t n, int64_t inner);
template <class T>
void launch_sub(const T* a, const T* b, T* out, int64_t n, int64_t inner);
template <class T>
void launch_mul(const T* a, const T* b, T* out, int64_t n, int64_t inner);

// y[i] = alpha * x[i] + beta * y[i]; when beta == 0, y is only written (it may hold garbage or NaN).
template <class T>
void launch_axpby(T alpha, const T* x, T beta, T* y, int64_t n);

// Sets n elements of `elem_bytes` bytes (2, 4 or 8) to the low `elem_bytes` bytes of `bits`.
void launch_fill(void* data, int64_t n, size_t elem_bytes, uint64_t bits);

}  // namespace lt::cuda
