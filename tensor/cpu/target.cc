// Reports which Highway target the dynamic dispatcher picks on this machine.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/target.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
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
}  // namespace lt
#endif
