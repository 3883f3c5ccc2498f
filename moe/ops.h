// The differentiable MoE ops, each with its backward beside its forward in moe/ops.cpp.
#pragma once
#include <vector>

#include "autograd/variable.h"

namespace lt {

// Top-k weights renormalised to sum 1 per row (norm_topk_prob): w = v / sum_j v.
Variable normalize_rows(const Variable& v_NK);

// Router z-loss (ST-MoE): mean over tokens of logsumexp(logits)^2, scalar [1], unscaled.
Variable router_z_loss(const Variable& logits_NE);

// Switch/GShard load-balance loss, unscaled: E * sum_e f_e * P_e, where f_e = (assignments routed to
// e) / (N k) is a constant and P_e = mean over tokens of probs[:, e] carries the gradient. Equals 1 at
// perfect balance. `expert_counts` [E] holds the assignment counts.
Variable load_balance_loss(const Variable& probs_NE, const std::vector<int64_t>& expert_counts, int64_t k);

// out[m, :] = x[m, :] * w[m]: weighting expert outputs by their routing weights.
Variable scale_rows(const Variable& x_MC, const Variable& w_M);

// The grouped expert matmul: rows [offsets[e], offsets[e+1]) of x [M, K] are multiplied by w[e]^T,
// w [E, N, K] (one expert's nn.Linear weight per slice), giving y [M, N]. Segments may be empty.
Variable grouped_matmul(const Variable& x_MK, const Variable& w_ENK, const std::vector<int64_t>& offsets);

}  // namespace lt
