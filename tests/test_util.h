// Helpers shared by the tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "hwy/targets.h"
#include "tensor/cpu/amx.h"
#include "tensor/cpu/bf16_dot.h"
#include "tensor/kernels.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace lt::test {

// Runs fn once per Highway target this machine supports, with the dispatcher forced to that target
// (SCOPED_TRACE names it on failure), then restores normal dispatch.
inline void for_each_cpu_target(const std::function<void()>& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("Highway target ") + hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Matmuls (and attention's block products) in the given precision while the scope lives, f32 after.
struct MatmulPrecisionScope {
  explicit MatmulPrecisionScope(kernels::MatmulPrecision p) { kernels::set_matmul_precision(p); }
  ~MatmulPrecisionScope() { kernels::set_matmul_precision(kernels::MatmulPrecision::F32); }
  MatmulPrecisionScope(const MatmulPrecisionScope&) = delete;
  MatmulPrecisionScope& operator=(const MatmulPrecisionScope&) = delete;
};

// Runs fn once per tile unit the bf16 GEMM (and attention's bf16 products) can use on this CPU: VDPBF16PS alone (AmxTiles::Off), the
// AMX blocking with emulated tiles (any CPU with AVX512_BF16) and the AMX tiles themselves (where the CPU
// has them), then restores the default.
inline void for_each_bf16_tile_unit(const std::function<void(const char*)>& fn) {
  const cpu::AmxTiles original = cpu::amx_tiles();
  std::vector<std::pair<cpu::AmxTiles, const char*>> units = {{cpu::AmxTiles::Off, "VDPBF16PS"}};
  if (cpu::has_bf16_dot()) units.push_back({cpu::AmxTiles::Emulated, "emulated AMX"});
  if (cpu::has_amx_bf16()) units.push_back({cpu::AmxTiles::Hardware, "AMX"});
  for (const auto& [tiles, name] : units) {
    cpu::set_amx_tiles(tiles);
    fn(name);
  }
  cpu::set_amx_tiles(original);
}

// Element-wise comparison with a tolerance relative to the larger magnitude (and an absolute floor).
template <class T>
void expect_close(const std::vector<T>& actual, const std::vector<T>& expected, double rtol, double atol = 0.0,
                  const std::string& what = "") {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double tol = atol + rtol * std::max(std::fabs(a), std::fabs(e));
    if (!(std::fabs(a - e) <= tol) && reported++ < 5)
      ADD_FAILURE() << what << " element " << i << ": got " << a << ", expected " << e;
  }
}

inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::F32, double std = 1.0) {
  Rng rng(seed);
  return Tensor::randn(shape, rng, std, dtype);
}

// first [..., C] and second [..., C] side by side as one [..., 2C] (a fused gate_up, as swiglu takes it),
// on first's device and in its dtype.
inline Tensor side_by_side(const Tensor& first, const Tensor& second) {
  const Tensor a = first.to(Device::cpu()), b = second.to(Device::cpu());
  const int64_t C = a.dim(-1), rows = C == 0 ? 0 : a.numel() / C;
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(a.dtype());
  Shape shape = a.shape();
  shape.back() *= 2;
  Tensor out = Tensor::empty(shape, a.dtype());
  auto* o = static_cast<char*>(out.raw_data());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(o + 2 * r * row_bytes, static_cast<const char*>(a.raw_data()) + r * row_bytes, row_bytes);
    std::memcpy(o + (2 * r + 1) * row_bytes, static_cast<const char*>(b.raw_data()) + r * row_bytes, row_bytes);
  }
  return out.to(first.device());
}

// The two halves of t's last dimension [..., 2C], as tensors [..., C] of their own (on the CPU).
inline std::pair<Tensor, Tensor> halves(const Tensor& t) {
  const Tensor x = t.to(Device::cpu());
  const int64_t C = x.dim(-1) / 2, rows = C == 0 ? 0 : x.numel() / (2 * C);
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(x.dtype());
  Shape shape = x.shape();
  shape.back() = C;
  Tensor first = Tensor::empty(shape, x.dtype()), second = Tensor::empty(shape, x.dtype());
  const auto* in = static_cast<const char*>(x.raw_data());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(first.raw_data()) + r * row_bytes, in + 2 * r * row_bytes, row_bytes);
    std::memcpy(static_cast<char*>(second.raw_data()) + r * row_bytes, in + (2 * r + 1) * row_bytes, row_bytes);
  }
  return {first, second};
}

}  // namespace lt::test
