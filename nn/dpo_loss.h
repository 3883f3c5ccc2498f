// The DPO loss as an autograd op: sigmoid DPO over pairs of responses plus Ling's NLL term on the
// chosen one (kernels::dpo_loss has the formula), fused from the per-token log-probabilities so the
// per-response sums, the loss, TRL's metrics and the gradient come out of one pass.
#pragma once
#include "autograd/variable.h"
#include "tensor/kernels.h"

namespace lt {

struct DpoLoss {
  Variable loss;  // scalar [1]
  Tensor stats;   // f64 [kernels::kDpoStats]: sums over the pairs, by kernels::DpoStat
};

// token_logp [N] (normhead_token_logprobs of the packed rows), response and counted i32 [N], reference_logp
// f64 [2P]. Differentiable in token_logp.
DpoLoss dpo_loss(const Variable& token_logp, const Tensor& response, const Tensor& counted,
                 const Tensor& reference_logp, double beta, double rpo_alpha);

}  // namespace lt
