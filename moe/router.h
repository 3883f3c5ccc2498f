// The Ling router (spec/ling.md §3.6, §10.1, §10.3): f32 logits x W_g^T, softmax over all experts,
// top-k, renormalised weights (norm_topk_prob), plus the training-time load-balance loss, z-loss and
// stochastic routing warmup.
#pragma once
#include <cstdint>
#include <vector>

#include "autograd/variable.h"
#include "tensor/random.h"

namespace lt {

// Stochastic routing warmup: for step i < W the logits fed to softmax/top-k are
//   s_hat = alpha s + (1 - alpha)(mu + sigma eps),  alpha = min(i / W, 1),  eps ~ N(0, I) per token and expert.
// The report leaves mu/sigma's definition open (UNVERIFIED). Our choice: one scalar mean and standard
// deviation per MoE layer over all router logits of a step, tracked as an exponential moving average
// (momentum 0.99, initialised from the first step); they are constants for the gradient, which flows
// only through alpha s. s_hat feeds softmax, top-k, the gating weights and both auxiliary losses.
struct RoutingWarmup {
  double mean = 0.0, std = 1.0;
  bool initialized = false;
  static constexpr double kMomentum = 0.99;
  void observe(const Tensor& logits);  // updates the running statistics from detached logits
};

struct RouterSettings {
  int64_t top_k = 1;
  bool norm_topk_prob = true;
  double aux_loss_coef = 0.015, z_loss_coef = 1e-4;  // weights of the balance and z losses (spec/ling.md §10.3)
  int64_t warmup_steps = 0;  // W; 0 disables the warmup
  int64_t step = 0;          // the global optimiser step (alpha = min(step / W, 1))
  bool training = false;     // warmup and its statistics apply only in training
  bool update_warmup_stats = true;  // false keeps mu/sigma fixed (gradient checks)
};

// The router is two fused ops on the projection's logits s = x W_g^T: the choice (warmup mixing,
// softmax over all experts, top-k, renormalisation: one kernel per direction) and the auxiliary loss
// (balance and z losses: one kernel per direction). Both send their gradients back through the mixing
// (a factor alpha) into s, and from there one GEMM pair reaches x and W_g.
struct Routing {
  Tensor logits;           // [N, E], after warmup mixing
  Tensor probs;            // [N, E] softmax over all experts
  Tensor lse;              // [N] logsumexp of the logits
  Variable weights;        // [N, k] gating weights (renormalised when norm_topk_prob and k > 1)
  Tensor expert_ids;       // [N, k] i32
  std::vector<int64_t> expert_counts;  // [E] assignments per expert
  // Switch/GShard load balance E * sum_e f_e P_e (f_e = counts / (N k), a constant; P_e the mean of
  // probs[:, e]) and ST-MoE z-loss mean_n logsumexp(logits_n)^2, unscaled (spec/ling.md §10.3).
  double balance = 0, z = 0;
  Variable aux_loss;       // scalar [1]: aux_loss_coef * balance + z_loss_coef * z
};

Routing route(const Variable& x_NH, const Variable& gate_EH, const RouterSettings& settings, RoutingWarmup& warmup,
              Rng& rng);

}  // namespace lt
