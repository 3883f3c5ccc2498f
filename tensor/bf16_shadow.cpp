#include "tensor/bf16_shadow.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include "tensor/error.h"

namespace lt {
namespace {

struct Registered {
  const Bf16Shadow* owner;
  Tensor values, values_bf16;
};
std::mutex registry_mutex;
std::vector<Registered>& registry() {
  static std::vector<Registered> entries;
  return entries;
}

}  // namespace

Bf16Shadow::Bf16Shadow(const Tensor& values, const Tensor& values_bf16) {
  LT_CHECK(values.dtype() == DType::F32 && values_bf16.dtype() == DType::BF16 &&
               values.shape() == values_bf16.shape() && values.device() == values_bf16.device(),
           "Bf16Shadow: ", values_bf16.str(), " is not a bf16 copy of ", values.str());
  const std::lock_guard<std::mutex> lock(registry_mutex);
  registry().push_back({this, values.reshape({values.numel()}), values_bf16.reshape({values.numel()})});
}

Bf16Shadow::~Bf16Shadow() {
  const std::lock_guard<std::mutex> lock(registry_mutex);
  std::vector<Registered>& entries = registry();
  entries.erase(std::find_if(entries.begin(), entries.end(), [this](const Registered& r) { return r.owner == this; }));
}

Tensor bf16_shadow_of(const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::F32 || t.numel() == 0) return Tensor();
  const auto* begin = static_cast<const float*>(t.raw_data());
  const std::lock_guard<std::mutex> lock(registry_mutex);
  for (const Registered& r : registry()) {
    const auto* base = static_cast<const float*>(r.values.raw_data());
    if (r.values.device() != t.device() || begin < base || begin + t.numel() > base + r.values.numel()) continue;
    return r.values_bf16.narrow(begin - base, t.numel()).reshape(t.shape());
  }
  return Tensor();
}

}  // namespace lt
