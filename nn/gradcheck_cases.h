#pragma once
#include <vector>

#include "autograd/gradcheck.h"

namespace lt {
std::vector<GradCase> nn_gradcheck_cases();
}
