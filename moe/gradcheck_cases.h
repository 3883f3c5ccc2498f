#pragma once
#include <vector>

#include "autograd/gradcheck.h"

namespace lt {
// Gradient checks of the MoE ops: router (with and without warmup mixing), both auxiliary losses,
// top-k renormalisation, permute/unpermute, the grouped expert matmul (also through the expert-parallel
// path on one rank), the whole MoE block.
std::vector<GradCase> moe_gradcheck_cases();
}
