// The DPO loss's per-pair arithmetic, shared by the CPU kernel (tensor/cpu/dpo.cc) and the CUDA kernel
// (tensor/cuda/dpo.cu): both sum the responses' log-probabilities in token order and then run this same
// code over the pairs, in f64.
#pragma once
#include <cmath>
#include <cstdint>

#include "tensor/host_device.h"
#include "tensor/kernels.h"

namespace lt {

// log(1 + e^x) without overflow for large x or loss of precision for very negative x.
LT_HOST_DEVICE inline double Softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
LT_HOST_DEVICE inline double Sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

// From the responses' log-probabilities logp [2P] (chosen 2p, rejected 2p + 1), the reference's ref
// [2P] and the NLL sum over nll_tokens chosen tokens: stats [kDpoStats] (sums over pairs, zeroed here),
// dlogp [2P] = d loss / d logp, *loss and *dnll = d loss / d (a chosen token's log-prob) via the NLL.
LT_HOST_DEVICE inline void DpoPairs(const double* logp, const double* ref, int64_t P, double beta, double rpo_alpha,
                                    double nll_sum, int64_t nll_tokens, double* stats, double* dlogp, double* loss,
                                    double* dnll) {
  using namespace kernels;
  for (int i = 0; i < kDpoStats; ++i) stats[i] = 0;
  // d loss / d logp[2p] = -beta sigmoid(r_l - r_w) / P, and the opposite for logp[2p + 1].
  for (int64_t p = 0; p < P; ++p) {
    const double r_w = beta * (logp[2 * p] - ref[2 * p]), r_l = beta * (logp[2 * p + 1] - ref[2 * p + 1]);
    stats[kDpoRewardChosen] += r_w;
    stats[kDpoRewardRejected] += r_l;
    stats[kDpoCorrect] += r_w > r_l ? 1 : 0;
    stats[kDpoMargin] += r_w - r_l;
    stats[kDpoLogpChosen] += logp[2 * p];
    stats[kDpoLogpRejected] += logp[2 * p + 1];
    stats[kDpoLoss] += Softplus(r_l - r_w);
    const double d = beta * Sigmoid(r_l - r_w) / static_cast<double>(P);
    dlogp[2 * p] = -d;
    dlogp[2 * p + 1] = d;
  }
  stats[kDpoNllSum] = nll_sum;
  stats[kDpoNllTokens] = static_cast<double>(nll_tokens);
  stats[kDpoPairs] = static_cast<double>(P);
  const double nll = nll_tokens > 0 ? nll_sum / static_cast<double>(nll_tokens) : 0.0;
  *loss = (P > 0 ? stats[kDpoLoss] / static_cast<double>(P) : 0.0) + rpo_alpha * nll;
  *dnll = nll_tokens > 0 ? -rpo_alpha / static_cast<double>(nll_tokens) : 0.0;
}

// d loss / d token_logp[n] for a token of response id (-1: none), counted or not in the DPO log-prob.
LT_HOST_DEVICE inline double DpoTokenGradient(int32_t id, bool counted, const double* dlogp, double dnll) {
  double d = 0;
  if (id >= 0) {
    if (counted) d += dlogp[id];
    if (id % 2 == 0) d += dnll;
  }
  return d;
}

}  // namespace lt
