#pragma once
#include <vector>

#include "autograd/gradcheck.h"

namespace lt {
// Every gradient check of every layer: the core ops, nn/ and moe/.
std::vector<GradCase> all_gradcheck_cases();
}
