#include "model/gradcheck_cases.h"

#include "moe/gradcheck_cases.h"
#include "nn/gradcheck_cases.h"

namespace lt {

std::vector<GradCase> all_gradcheck_cases() {
  std::vector<GradCase> cases = core_gradcheck_cases();
  for (auto more : {nn_gradcheck_cases(), moe_gradcheck_cases()}) cases.insert(cases.end(), more.begin(), more.end());
  return cases;
}

}  // namespace lt
