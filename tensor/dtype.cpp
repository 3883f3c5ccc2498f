#include "tensor/dtype.h"

#include "tensor/error.h"

namespace lt {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  fail("unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  fail("unknown dtype");
}

DType dtype_from_name(const std::string& name) {
  if (name == "f32" || name == "F32" || name == "float32") return DType::F32;
  if (name == "f64" || name == "F64" || name == "float64") return DType::F64;
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return DType::BF16;
  if (name == "i32" || name == "I32" || name == "int32") return DType::I32;
  if (name == "i64" || name == "I64" || name == "int64") return DType::I64;
  fail("unknown dtype '", name, "'");
}

}  // namespace lt
