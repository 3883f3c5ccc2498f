// Every gradient-check case of the table, as its own GoogleTest test.
#include <gtest/gtest.h>

#include <cctype>
#include <ostream>
#include <string>

#include "model/gradcheck_cases.h"

namespace lt {

// What --gtest_list_tests and failures show for a case, instead of its 128 raw bytes.
void PrintTo(const GradCase& c, std::ostream* out) { *out << c.op << ": " << c.variant; }

namespace {

class GradCheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(GradCheck, BackwardMatchesFiniteDifferences) {
  const GradCheckResult r = gradcheck(GetParam());
  EXPECT_GT(r.checked, 0);
  EXPECT_TRUE(r.pass) << r.op << " [" << r.variant << "] max_abs=" << r.max_abs << " max_rel=" << r.max_rel;
}

// "matmul_NT_batched_3x_1x17_17x3": the op and its variant, each run of other characters one '_'.
// GoogleTest refuses two equal names, so the table cannot hold the same case twice unnoticed.
std::string case_name(const ::testing::TestParamInfo<GradCase>& info) {
  std::string name;
  for (char c : info.param.op + " " + info.param.variant) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      name += c;
    else if (!name.empty() && name.back() != '_')
      name += '_';
  }
  if (!name.empty() && name.back() == '_') name.pop_back();
  return name;
}

INSTANTIATE_TEST_SUITE_P(Core, GradCheck, ::testing::ValuesIn(all_gradcheck_cases()), case_name);

}  // namespace
}  // namespace lt
