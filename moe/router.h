// The Ling router (docs/architecture.md §3.7, §7.1-7.4): f32 logits x W_g^T, softmax over all
// experts, top-k, renormalised weights (norm_topk_prob), plus the training-time load-balance loss,
// z-loss and stochastic routing warmup.
#pragma once
#include <cstdint>

#include "autograd/variable.h"
#include "tensor/random.h"

namespace lt {

// Stochastic routing warmup: for step i < W the logits fed to softmax/top-k are
//   s_hat = alpha s + (1 - alpha)(mu + sigma eps),  alpha = min(i / W, 1),  eps ~ N(0, I) per token and expert.
// The report leaves mu/sigma's definition open (UNVERIFIED). Our choice: one scalar mean and standard
// deviation per MoE layer over all router logits of a step, tracked as an exponential moving average
// (momentum 0.99, initialised from the first step); they are constants for the gradient, which flows
// only through alpha s. s_hat feeds softmax, top-k, the gating weights and both auxiliary losses.
// The statistics are a tensor on the router's device (the MoE block's "router_warmup" buffer, saved
// with the training state), so neither the update nor the mixing reads them on the host:
//   f64 [3] = [mean, std, observed], observed 0 until the first step has set mean and std.
// They stay fixed during a step: each forward adds its logits to the step's observations (the block's
// "router_warmup_observations" buffer, which data parallel averages with the others), folded into the
// statistics once the step's backward is done (kernels::routing_warmup_fold). So the micro-batches and
// ranks of a step see the same statistics and together fold the same figures, whatever the layout.
inline constexpr double kRoutingWarmupMomentum = 0.99;
Tensor routing_warmup_stats();  // [0, 1, 0]: nothing observed yet

struct RouterSettings {
  int64_t top_k = 1;
  bool norm_topk_prob = true;
  // Weights of the balance and z losses (docs/architecture.md §7.2-7.3).
  double aux_loss_coef = 0.015, z_loss_coef = 1e-4;
  int64_t warmup_steps = 0;  // W; 0 disables the warmup
  int64_t step = 0;          // the global optimiser step (alpha = min(step / W, 1))
  bool training = false;     // warmup and its statistics apply only in training
  // The warmup noise of a token is a function of where it is, not of who routes it: the E normals of the
  // token at position t of the step's global sequence g, in decoder layer `layer`, come from a generator
  // seeded by (noise_seed, step, layer, g, t) (warmup_noise below). Row n of x is position n % T of
  // sequence first_sequence + n / T (T = tokens_per_sequence). So every layout of a step (ranks,
  // micro-batches, expert parallel, sharding) gives a token the same noise, and a resumed run needs no
  // generator state.
  uint64_t noise_seed = 0;
  int64_t layer = 0, first_sequence = 0, tokens_per_sequence = 1;
};

// The router is two fused ops on the projection's logits s = x W_g^T: the choice (warmup mixing,
// softmax over all experts, top-k, renormalisation) and the auxiliary loss (balance and z losses): one
// kernel for both forwards (router_topk_with_aux_loss), one for each backward. Both send their gradients
// back through the mixing (a factor alpha) into s, and from there one GEMM pair reaches x and W_g.
struct Routing {
  Tensor logits;           // [N, E], after warmup mixing
  Tensor probs;            // [N, E] softmax over all experts
  Tensor lse;              // [N] logsumexp of the logits
  Variable weights;        // [N, k] gating weights (renormalised when norm_topk_prob and k > 1)
  Tensor expert_ids;       // [N, k] i32
  Tensor counts_E;         // [E] assignments per expert, exact integers in the logits' dtype
  // Switch/GShard load balance E * sum_e f_e P_e (f_e = counts / (N k), a constant; P_e the mean of
  // probs[:, e]) and ST-MoE z-loss mean_n logsumexp(logits_n)^2, unscaled (docs/architecture.md
  // §7.2-7.3): f64 [1].
  Tensor balance, z;
  Variable aux_loss;       // scalar [1]: aux_loss_coef * balance + z_loss_coef * z
};

// The standard normals eps [N, E] (f64, on the host) of the warmup noise of N rows (RouterSettings).
Tensor warmup_noise(const RouterSettings& settings, int64_t N, int64_t E);

// warmup_stats: the layer's routing-warmup statistics (above); observations, where not null, receives
// this forward's logits while the warmup runs (kernels::routing_warmup_observe).
Routing route(const Variable& x_NH, const Variable& gate_EH, const RouterSettings& settings,
              const Tensor& warmup_stats, Tensor* observations);

}  // namespace lt
