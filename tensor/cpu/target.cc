// Reports which Highway target the dynamic dispatcher picks on this machine, and caps it.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/target.cc"
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/error.h"
#include "tensor/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace lt::HWY_NAMESPACE {
int64_t DispatchedTarget() { return HWY_TARGET; }
}  // namespace lt::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt {
HWY_EXPORT(DispatchedTarget);
const char* cpu_kernel_target() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(DispatchedTarget)()); }

void cap_cpu_target_from_environment() {
  const char* variable = "LINGTRAIN_CPU_TARGET";
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return;
  const std::string name = value;
  const auto same_name = [&name](int64_t target) {
    const std::string target_name = hwy::TargetName(target);
    return std::equal(name.begin(), name.end(), target_name.begin(), target_name.end(),
                      [](char a, char b) { return std::toupper(static_cast<unsigned char>(a)) == b; });
  };
  std::string compiled_names;
  int64_t cap = 0;
  for (int64_t targets = HWY_TARGETS; targets != 0; targets &= targets - 1) {
    const int64_t target = targets & -targets;
    compiled_names += std::string(compiled_names.empty() ? "" : ", ") + hwy::TargetName(target);
    if (same_name(target)) cap = target;
  }
  LT_CHECK(cap != 0, variable, "=", name, " is not a CPU target of this build (", compiled_names, ")");
  LT_CHECK((hwy::SupportedTargets() & cap) != 0, variable, "=", name, " is a target this CPU cannot run (its best is ",
           cpu_kernel_target(), ")");
  // Highway numbers the targets of an architecture from the newest (lowest bit) down: every bit below
  // the cap is a newer target. Disabling them also resets the dispatch tables already filled.
  hwy::DisableTargets(cap - 1);
}
}  // namespace lt
#endif
