// The MoE router's per-token arithmetic, shared by the CPU kernels (tensor/cpu/moe.cc, a thread per
// chunk of rows) and the CUDA kernels (tensor/cuda/moe.cu, a thread per row), so both backends run the
// same code: the softmax over the experts with its log-sum-exp, the top-k choice and renormalisation,
// the router's two backwards, and the routing warmup's fold of a step's observations.
#pragma once
#include <cmath>
#include <cstdint>

#include "tensor/host_device.h"
#include "tensor/kernel_types.h"
#include "tensor/topk_row.h"

namespace lt {

// routing_warmup_fold (tensor/kernels.def): observations [count, sum of d, sum of d^2] (d = logit - the
// statistics' mean) into stats [mean, std, observed], then the observations zeroed.
LT_HOST_DEVICE inline void fold_warmup_observations(double* observations, double momentum, double* stats) {
  const double count = observations[0];
  if (count > 0) {
    const double shift = observations[1] / count;
    const double variance = multiply_then_add(-shift, shift, observations[2] / count);
    const double mean = stats[0] + shift, deviation = sqrt(variance > 0 ? variance : 0.0);
    if (stats[2] == 0) {
      stats[0] = mean;
      stats[1] = deviation;
      stats[2] = 1;
    } else {
      stats[0] = momentum * stats[0] + (1 - momentum) * mean;
      stats[1] = momentum * stats[1] + (1 - momentum) * deviation;
    }
  }
  observations[0] = observations[1] = observations[2] = 0;
}

// Row n of router_topk: probs = softmax(logits) with the sum in f64 (exact to the dtype whatever E),
// lse, then the k most probable experts and their (renormalised) weights.
template <class T>
LT_HOST_DEVICE inline void RouterTopKRow(const T* logits, int64_t E, int64_t k, bool renormalize, T* probs, T* lse,
                                         T* weights, int32_t* ids) {
  T max = logits[0];
  for (int64_t e = 1; e < E; ++e) max = max < logits[e] ? logits[e] : max;
  double total = 0;
  for (int64_t e = 0; e < E; ++e) total += exp(static_cast<double>(logits[e] - max));
  for (int64_t e = 0; e < E; ++e) probs[e] = static_cast<T>(exp(static_cast<double>(logits[e] - max)) / total);
  *lse = static_cast<T>(static_cast<double>(max) + log(total));
  TopKRow(probs, E, k, weights, ids);
  if (!renormalize) return;
  T sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += weights[j];
  for (int64_t j = 0; j < k; ++j) weights[j] /= sum;
}

// Row n of router_topk_backward. With S = sum_j p[i_j] and dw the incoming gradient of the weights:
//   dp[i_j] = (dw_j - sum_l dw_l w_l) / S  (renormalised; w_l = p[i_l] / S), or dw_j (not);
//   ds_e = scale p_e (dp_e - sum_j dp[i_j] p[i_j]), dp_e = 0 for the experts not chosen.
template <class T>
LT_HOST_DEVICE inline void RouterTopKBackwardRow(const T* probs, const int32_t* ids, int64_t E, int64_t k,
                                                 bool renormalize, const T* dweights, T scale, T* dlogits) {
  T dp[kernels::kRouterMaxTopK];
  if (renormalize) {
    T sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += probs[ids[j]];
    T dot = 0;
    for (int64_t j = 0; j < k; ++j) dot += dweights[j] * (probs[ids[j]] / sum);
    for (int64_t j = 0; j < k; ++j) dp[j] = (dweights[j] - dot) / sum;
  } else {
    for (int64_t j = 0; j < k; ++j) dp[j] = dweights[j];
  }
  T dot = 0;
  for (int64_t j = 0; j < k; ++j) dot += dp[j] * probs[ids[j]];
  for (int64_t e = 0; e < E; ++e) dlogits[e] = -scale * probs[e] * dot;
  for (int64_t j = 0; j < k; ++j) dlogits[ids[j]] += scale * probs[ids[j]] * dp[j];
}

// Row n of router_aux_backward, the scales a = g balance_scale and b = g z_scale already in T:
//   ds_e = p_e (a c_e + b lse - a sum_f p_f c_f).
template <class T>
LT_HOST_DEVICE inline void RouterAuxBackwardRow(const T* probs, T lse, const T* counts, int64_t E, T a, T b,
                                                T* dlogits) {
  T mean_count = 0;  // sum_e p_e c_e
  for (int64_t e = 0; e < E; ++e) mean_count += probs[e] * counts[e];
  const T row_term = b * lse - a * mean_count;
  for (int64_t e = 0; e < E; ++e) dlogits[e] = probs[e] * (a * counts[e] + row_term);
}

}  // namespace lt
