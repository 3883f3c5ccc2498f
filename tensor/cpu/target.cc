// Reports which Highway target the dynamic dispatcher picks on this machine, and caps it; reads the size
// of its L2 cache.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/target.cc"
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/amx.h"
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

namespace {
// A cache's size as sysfs writes it ("1024K", "32M"), in bytes; 0 if unreadable.
int64_t parse_cache_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0) return 0;
  const int64_t value = std::stoll(text.substr(0, digits));
  const char unit =
      digits < text.size() ? static_cast<char>(std::toupper(static_cast<unsigned char>(text[digits]))) : 'B';
  return unit == 'K' ? value << 10 : unit == 'M' ? value << 20 : unit == 'B' ? value : 0;
}

int64_t read_l2_cache_bytes() {
  // sysfs describes the caches the kernel sees, a VM's included (sysconf's figures come from CPUID
  // leaves that a hypervisor may leave at the host's values).
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    std::string level, type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) continue;
    if (level != "2" || type == "Instruction") continue;
    if (const int64_t bytes = parse_cache_size(size); bytes > 0) return bytes;
  }
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long from_sysconf = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (from_sysconf > 0) return from_sysconf;
#endif
  return int64_t{1} << 20;
}
}  // namespace

int64_t cpu_l2_cache_bytes() {
  static const int64_t bytes = read_l2_cache_bytes();
  return bytes;
}

void cap_cpu_target_from_environment() {
  // LINGTRAIN_CPU_AMX is read and checked here, on the main thread, rather than by the first bf16 GEMM.
  cpu::amx_tiles();
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
