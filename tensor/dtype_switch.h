// Dtype dispatch for kernels that take raw storage: binds a C++ element type to a runtime DType.
#pragma once
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/error.h"

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
