// Helpers shared by the tests.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "hwy/targets.h"
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

}  // namespace lt::test
