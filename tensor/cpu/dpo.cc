// The DPO loss kernel. It is O(N) scalar work next to the head's O(N V H) GEMMs, so it stays plain
// C++; every sum is in f64 in token and pair order, so the result does not depend on the thread count.
#include <cmath>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/kernels.h"

namespace lt::cpu {

namespace {
// log(1 + e^x) without overflow for large x or loss of precision for very negative x.
double softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1 / (1 + std::exp(-x)) : std::exp(x) / (1 + std::exp(x)); }
}  // namespace

void dpo_loss(const Tensor& token_logp, const Tensor& response, const Tensor& counted, const Tensor& reference_logp,
              double beta, double rpo_alpha, Tensor& loss, Tensor& stats, Tensor& dtoken_logp) {
  using namespace kernels;
  const int64_t N = token_logp.numel(), P = reference_logp.numel() / 2;
  const int32_t* ids = response.data<int32_t>();
  const int32_t* in_dpo = counted.data<int32_t>();
  const double* ref = reference_logp.data<double>();
  std::vector<double> logp(static_cast<size_t>(2 * P), 0.0);
  double nll_sum = 0;
  int64_t nll_tokens = 0;
  LT_FLOAT_SWITCH(token_logp.dtype(), T, {
    const T* x = token_logp.data<T>();
    for (int64_t n = 0; n < N; ++n) {
      if (ids[n] < 0) continue;
      if (in_dpo[n]) logp[static_cast<size_t>(ids[n])] += static_cast<double>(x[n]);
      if (ids[n] % 2 == 0) {
        nll_sum -= static_cast<double>(x[n]);
        ++nll_tokens;
      }
    }
  });
  double* s = stats.data<double>();
  for (int i = 0; i < kDpoStats; ++i) s[i] = 0;
  // d loss / d logp[2p] = -beta sigmoid(r_l - r_w) / P, and the opposite for logp[2p + 1].
  std::vector<double> dlogp(static_cast<size_t>(2 * P), 0.0);
  for (int64_t p = 0; p < P; ++p) {
    const double r_w = beta * (logp[2 * p] - ref[2 * p]), r_l = beta * (logp[2 * p + 1] - ref[2 * p + 1]);
    const double pair_loss = softplus(r_l - r_w);
    s[kDpoRewardChosen] += r_w;
    s[kDpoRewardRejected] += r_l;
    s[kDpoCorrect] += r_w > r_l ? 1 : 0;
    s[kDpoMargin] += r_w - r_l;
    s[kDpoLogpChosen] += logp[2 * p];
    s[kDpoLogpRejected] += logp[2 * p + 1];
    s[kDpoLoss] += pair_loss;
    const double d = beta * sigmoid(r_l - r_w) / static_cast<double>(P);
    dlogp[2 * p] = -d;
    dlogp[2 * p + 1] = d;
  }
  s[kDpoNllSum] = nll_sum;
  s[kDpoNllTokens] = static_cast<double>(nll_tokens);
  s[kDpoPairs] = static_cast<double>(P);
  const double nll = nll_tokens > 0 ? nll_sum / static_cast<double>(nll_tokens) : 0.0;
  const double total = (P > 0 ? s[kDpoLoss] / static_cast<double>(P) : 0.0) + rpo_alpha * nll;
  const double dnll = nll_tokens > 0 ? -rpo_alpha / static_cast<double>(nll_tokens) : 0.0;
  LT_FLOAT_SWITCH(token_logp.dtype(), T, {
    *loss.data<T>() = static_cast<T>(total);
    if (dtoken_logp.defined()) {
      T* dx = dtoken_logp.data<T>();
      for (int64_t n = 0; n < N; ++n) {
        double d = 0;
        if (ids[n] >= 0) {
          if (in_dpo[n]) d += dlogp[static_cast<size_t>(ids[n])];
          if (ids[n] % 2 == 0) d += dnll;
        }
        dx[n] = static_cast<T>(d);
      }
    }
  });
}

}  // namespace lt::cpu
