// Element types. f32 trains, f64 runs the gradient checks (CPU only), bf16 is storage (and GPU
// compute with f32 accumulation), int32/int64 hold token ids and indices.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "tensor/host_device.h"

namespace lt {

enum class DType : uint8_t { F32, F64, BF16, I32, I64 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
DType dtype_from_name(const std::string& name);  // "f32", "F32", "float32", ... ; throws on unknown
inline bool is_floating(DType d) { return d == DType::F32 || d == DType::F64 || d == DType::BF16; }

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }

// bf16 is the top half of an f32. Conversion rounds to nearest, ties to even, as PyTorch does
// (Highway's demotion truncates, hence our own); the CUDA kernels round with the same code. NaNs stay NaN: a quiet bit is forced so that
// rounding cannot carry a NaN payload into infinity.
LT_HOST_DEVICE inline uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

LT_HOST_DEVICE inline float bf16_to_f32(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

}  // namespace lt
