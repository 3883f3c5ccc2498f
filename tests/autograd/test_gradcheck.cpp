// Every gradient-check case of the table, as its own GoogleTest test.
#include <gtest/gtest.h>

#include "model/gradcheck_cases.h"

namespace lt {
namespace {

class GradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheck, BackwardMatchesFiniteDifferences) {
  const GradCheckResult r = gradcheck(GetParam());
  EXPECT_GT(r.checked, 0);
  EXPECT_TRUE(r.pass) << r.op << " [" << r.variant << "] max_abs=" << r.max_abs << " max_rel=" << r.max_rel;
}

std::string case_name(const ::testing::TestParamInfo<GradCase>& info) {
  std::string name = info.param.op + "_" + std::to_string(info.index);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Core, GradCheck, ::testing::ValuesIn(all_gradcheck_cases()), case_name);

}  // namespace
}  // namespace lt
