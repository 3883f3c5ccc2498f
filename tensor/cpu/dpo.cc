// The DPO loss kernel. It is O(N) scalar work next to the head's O(N V H) GEMMs, so it stays plain
// C++; every sum is in f64 in token and pair order, so the result does not depend on the thread count.
// The per-pair arithmetic is shared with the CUDA kernel (tensor/dpo_math.h).
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/dpo_math.h"
#include "tensor/dtype_switch.h"

namespace lt::cpu {

void dpo_loss(const Tensor& token_logp, const Tensor& response, const Tensor& counted, const Tensor& reference_logp,
              double beta, double rpo_alpha, Tensor& loss, Tensor& stats, Tensor& dtoken_logp) {
  const int64_t N = token_logp.numel(), P = reference_logp.numel() / 2;
  const int32_t* ids = response.data<int32_t>();
  const int32_t* in_dpo = counted.data<int32_t>();
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
  std::vector<double> dlogp(static_cast<size_t>(2 * P), 0.0);
  double total = 0, dnll = 0;
  DpoPairs(logp.data(), reference_logp.data<double>(), P, beta, rpo_alpha, nll_sum, nll_tokens, stats.data<double>(),
           dlogp.data(), &total, &dnll);
  LT_FLOAT_SWITCH(token_logp.dtype(), T, {
    *loss.data<T>() = static_cast<T>(total);
    if (dtoken_logp.defined()) {
      T* dx = dtoken_logp.data<T>();
      for (int64_t n = 0; n < N; ++n) dx[n] = static_cast<T>(DpoTokenGradient(ids[n], in_dpo[n] != 0, dlogp.data(), dnll));
    }
  });
}

}  // namespace lt::cpu
