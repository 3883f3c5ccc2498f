// Shared argument checks and dtype dispatch for the kernel families (tensor/cpu/*.cc).
#pragma once
#include "tensor/tensor.h"

namespace lt::kernels {
enum class BinaryOp { Add, Sub, Mul };
}

#ifdef LINGTRAIN_CUDA
#include "tensor/cuda/kernels.h"
#endif

namespace lt::kernels {

inline void check_float(const Tensor& t, const char* op, const char* what) {
  LT_CHECK(t.defined(), op, ": ", what, " is undefined");
  LT_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": ", what, " must be f32 or f64, got ",
           t.str());
}

inline void check_index(const Tensor& t, const char* op, const char* what) {
  LT_CHECK(t.defined(), op, ": ", what, " is undefined");
  LT_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64, op, ": ", what, " must be i32 or i64, got ",
           t.str());
}

// Same dtype and device as the reference operand.
inline void check_like(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  LT_CHECK(t.defined(), op, ": ", what, " is undefined");
  LT_CHECK(t.dtype() == ref.dtype() && t.device() == ref.device(), op, ": ", what, " is ", t.str(),
           ", expected ", dtype_name(ref.dtype()), " on ", ref.device().str());
}

inline void check_shape(const Tensor& t, const Shape& shape, const char* op, const char* what) {
  LT_CHECK(t.shape() == shape, op, ": ", what, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(shape));
}

// For families with no CUDA kernel yet: one clear error instead of reading device memory on the host.
inline void require_cpu(const Tensor& t, const char* op) {
  LT_CHECK(t.is_cpu(), op, ": no CUDA kernel yet for ", t.str());
}

}  // namespace lt::kernels

// Runs the statement with T bound to the C++ type of a floating dtype (f32 or f64).
#define LT_FLOAT_SWITCH(dtype, T, ...)                                       \
  switch (dtype) {                                                           \
    case ::lt::DType::F32: {                                                 \
      using T = float;                                                       \
      __VA_ARGS__;                                                           \
      break;                                                                 \
    }                                                                        \
    case ::lt::DType::F64: {                                                 \
      using T = double;                                                      \
      __VA_ARGS__;                                                           \
      break;                                                                 \
    }                                                                        \
    default:                                                                 \
      ::lt::fail("kernel: unsupported dtype ", ::lt::dtype_name(dtype));     \
  }

// The same for integer index dtypes (i32 or i64).
#define LT_INDEX_SWITCH(dtype, I, ...)                                       \
  switch (dtype) {                                                           \
    case ::lt::DType::I32: {                                                 \
      using I = int32_t;                                                     \
      __VA_ARGS__;                                                           \
      break;                                                                 \
    }                                                                        \
    case ::lt::DType::I64: {                                                 \
      using I = int64_t;                                                     \
      __VA_ARGS__;                                                           \
      break;                                                                 \
    }                                                                        \
    default:                                                                 \
      ::lt::fail("kernel: unsupported index dtype ", ::lt::dtype_name(dtype)); \
  }
