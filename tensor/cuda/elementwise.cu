// Elementwise CUDA kernels: add, sub, mul with broadcasting, axpby (scale and axpy) with the factor
// given or read from the device, sum_to (the backward of broadcasting), fill, f32 <-> bf16 conversion and
// the conversion between any two dtypes (Tensor::to(DType) of a device tensor).
//
// Each is a grid-stride loop: a grid sized to the data up to a cap, where every thread walks the
// range in steps of the whole grid. One thread owns each output element and nothing is reduced, so
// results are deterministic and need no atomics. Memory bound: the arithmetic is not the cost. sum_to
// is the exception, a sum over rows: column_sums (tensor/cuda/column_sums.h), in the CPU kernel's order.
#include <algorithm>
#include <cstdint>
#include <cstring>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/column_sums.h"
#include "tensor/bf16_shadow.h"
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

struct Add {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Sub {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a - b;
  }
};
struct Mul {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a * b;
  }
};

// No __restrict__: out may be a or b (in-place updates).
template <class Op, bool kBroadcast, class T>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n, int64_t inner) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) out[i] = Op{}(a[i], b[kBroadcast ? i % inner : i]);
}

template <class Op, class T>
void launch_binary(const T* a, const T* b, T* out, int64_t n, int64_t inner) {
  if (n == 0) return;
  // Same shapes (the common case) skip the 64-bit modulo, which costs more than the load it indexes.
  if (inner == n)
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, binary_kernel<Op, false>)(a, b, out, n, inner);
  else
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, binary_kernel<Op, true>)(a, b, out, n, inner);
  LT_CUDA_CHECK(cudaGetLastError());
}

// fma(alpha, x, beta * y) is exactly what the CPU kernel computes (Highway MulAdd), so both devices
// round the same way; written out so that nvcc's contraction cannot pick the other pairing.
template <bool kReadY, class T>
__global__ void axpby_kernel(T alpha, const T* x, T beta, T* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = kReadY ? fused_multiply_add(alpha, x[i], beta * y[i]) : alpha * x[i];
}

// axpby with alpha = factor * s[0] read where the data lives, rounded to T as the CPU kernel rounds it.
template <bool kReadY, class T>
__global__ void axpby_by_kernel(const T* s, double factor, const T* x, T beta, T* y, int64_t n) {
  const T alpha = static_cast<T>(factor * static_cast<double>(s[0]));
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = kReadY ? fused_multiply_add(alpha, x[i], beta * y[i]) : alpha * x[i];
}

// out[j] = the sum over rows of x[r, j], in T.
template <class T>
struct AddRowElement {
  const T* x;
  int64_t inner;
  __device__ T operator()(T sum, int64_t r, int64_t j) const { return sum + x[r * inner + j]; }
};

template <class T>
struct WriteColumnSum {
  T* out;
  __device__ void operator()(int64_t j, T total) const { out[j] = total; }
};

__global__ void round_to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = f32_to_bf16(x[i]);
}

__global__ void widen_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = bf16_to_f32(x[i]);
}

template <class Word>
__global__ void fill_kernel(Word* data, int64_t n, Word value) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) data[i] = value;
}

// An element of any dtype as a double, and back, as Tensor::to(DType) converts on the host (through a
// double; bf16 through f32, rounded to nearest even; integers truncated).
template <DType D>
struct Element;
template <>
struct Element<DType::F32> {
  __device__ static double load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  __device__ static void store(void* p, int64_t i, double v) { static_cast<float*>(p)[i] = static_cast<float>(v); }
};
template <>
struct Element<DType::F64> {
  __device__ static double load(const void* p, int64_t i) { return static_cast<const double*>(p)[i]; }
  __device__ static void store(void* p, int64_t i, double v) { static_cast<double*>(p)[i] = v; }
};
template <>
struct Element<DType::BF16> {
  __device__ static double load(const void* p, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(p)[i]); }
  __device__ static void store(void* p, int64_t i, double v) {
    static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
  }
};
template <>
struct Element<DType::I32> {
  __device__ static double load(const void* p, int64_t i) { return static_cast<const int32_t*>(p)[i]; }
  __device__ static void store(void* p, int64_t i, double v) { static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); }
};
template <>
struct Element<DType::I64> {
  __device__ static double load(const void* p, int64_t i) {
    return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  __device__ static void store(void* p, int64_t i, double v) { static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); }
};

template <DType From, DType To>
__global__ void convert_dtype_kernel(const void* x, void* y, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) Element<To>::store(y, i, Element<From>::load(x, i));
}

template <DType From>
void launch_convert_dtype(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  void* out = y.raw_data();
  switch (y.dtype()) {
    case DType::F32: LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, convert_dtype_kernel<From, DType::F32>)(x.raw_data(), out, n); break;
    case DType::F64: LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, convert_dtype_kernel<From, DType::F64>)(x.raw_data(), out, n); break;
    case DType::BF16: LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, convert_dtype_kernel<From, DType::BF16>)(x.raw_data(), out, n); break;
    case DType::I32: LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, convert_dtype_kernel<From, DType::I32>)(x.raw_data(), out, n); break;
    case DType::I64: LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, convert_dtype_kernel<From, DType::I64>)(x.raw_data(), out, n); break;
  }
}

template <class Word>
void launch_fill_words(void* data, int64_t n, uint64_t bits) {
  LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, fill_kernel)(static_cast<Word*>(data), n, static_cast<Word>(bits));
}

template <class T>
void launch_axpby(T alpha, const T* x, T beta, T* y, int64_t n) {
  if (n == 0) return;
  if (beta == T(0))
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, axpby_kernel<false>)(alpha, x, beta, y, n);
  else
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, axpby_kernel<true>)(alpha, x, beta, y, n);
  LT_CUDA_CHECK(cudaGetLastError());
}

void launch_fill(void* data, int64_t n, size_t elem_bytes, uint64_t bits) {
  if (n == 0) return;
  switch (elem_bytes) {
    case 2:
      launch_fill_words<uint16_t>(data, n, bits);
      break;
    case 4:
      launch_fill_words<uint32_t>(data, n, bits);
      break;
    case 8:
      launch_fill_words<uint64_t>(data, n, bits);
      break;
    default:
      fail("launch_fill: elements of ", elem_bytes, " bytes; only 2, 4 and 8 are supported");
  }
  LT_CUDA_CHECK(cudaGetLastError());
}

// The bit pattern of `value` stored as one element of `dtype`, as Tensor::fill_ stores it on the CPU.
uint64_t element_bits(DType dtype, double value) {
  uint64_t bits = 0;
  switch (dtype) {
    case DType::F32: {
      const float v = static_cast<float>(value);
      std::memcpy(&bits, &v, sizeof v);
      break;
    }
    case DType::F64:
      std::memcpy(&bits, &value, sizeof value);
      break;
    case DType::BF16:
      bits = f32_to_bf16(static_cast<float>(value));
      break;
    case DType::I32: {
      const int32_t v = static_cast<int32_t>(value);
      std::memcpy(&bits, &v, sizeof v);
      break;
    }
    case DType::I64: {
      const int64_t v = static_cast<int64_t>(value);
      std::memcpy(&bits, &v, sizeof v);
      break;
    }
  }
  return bits;
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, int64_t inner) {
  const DeviceGuard guard(a.device().index);
  LT_FLOAT_SWITCH(a.dtype(), T, {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    switch (op) {
      case BinaryOp::Add:
        launch_binary<Add>(pa, pb, po, a.numel(), inner);
        break;
      case BinaryOp::Sub:
        launch_binary<Sub>(pa, pb, po, a.numel(), inner);
        break;
      case BinaryOp::Mul:
        launch_binary<Mul>(pa, pb, po, a.numel(), inner);
        break;
    }
  });
}

void axpby(double alpha, const Tensor& x, double beta, Tensor& y) {
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, launch_axpby(T(alpha), x.data<T>(), T(beta), y.data<T>(), x.numel()));
}

void axpby_by(const Tensor& s, double factor, const Tensor& x, double beta, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, {
    if (beta == 0.0)
      LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, axpby_by_kernel<false, T>)(
          s.data<T>(), factor, x.data<T>(), T(beta), y.data<T>(), n);
    else
      LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, axpby_by_kernel<true, T>)(
          s.data<T>(), factor, x.data<T>(), T(beta), y.data<T>(), n);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void sum_to(const Tensor& x, Tensor& out) {
  const int64_t inner = out.numel();
  if (inner == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T,
                  column_sums<T>(x.numel() / inner, inner, AddRowElement<T>{x.data<T>(), inner},
                                 WriteColumnSum<T>{out.data<T>()}, x.device()));
}

void round_to_bf16(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, round_to_bf16_kernel)(x.data<float>(),
                                                                       static_cast<uint16_t*>(y.raw_data()), n);
  LT_CUDA_CHECK(cudaGetLastError());
}

void widen_bf16(const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, widen_bf16_kernel)(static_cast<const uint16_t*>(x.raw_data()),
                                                                    y.data<float>(), n);
  LT_CUDA_CHECK(cudaGetLastError());
}

Tensor bf16_operand(const Tensor& x) {
  if (x.dtype() == DType::BF16) return x;
  Tensor x16 = bf16_shadow_of(x);
  if (x16.defined()) return x16;
  x16 = Tensor::empty(x.shape(), DType::BF16, x.device());
  round_to_bf16(x, x16);
  return x16;
}

void convert(const Tensor& x, Tensor& y) {
  if (x.dtype() == DType::F32) return round_to_bf16(x, y);
  widen_bf16(x, y);
}

void convert_dtype(const Tensor& x, Tensor& y) {
  if (x.numel() == 0) return;
  const DeviceGuard guard(x.device().index);
  switch (x.dtype()) {
    case DType::F32: launch_convert_dtype<DType::F32>(x, y); break;
    case DType::F64: launch_convert_dtype<DType::F64>(x, y); break;
    case DType::BF16: launch_convert_dtype<DType::BF16>(x, y); break;
    case DType::I32: launch_convert_dtype<DType::I32>(x, y); break;
    case DType::I64: launch_convert_dtype<DType::I64>(x, y); break;
  }
  LT_CUDA_CHECK(cudaGetLastError());
}

void fill(Tensor& t, double value) {
  if (t.numel() == 0) return;
  const DeviceGuard guard(t.device().index);
  // Zero is all-zero bytes in every dtype (and -0.0 becomes +0.0, as in the CPU fill_).
  if (value == 0.0) {
    LT_CUDA_ZERO_ASYNC(t.raw_data(), t.nbytes());
    return;
  }
  launch_fill(t.raw_data(), t.numel(), dtype_size(t.dtype()), element_bits(t.dtype(), value));
}

}  // namespace lt::LT_CUDA_NAMESPACE
