#include "moe/router.h"

#include "autograd/ops.h"
#include "autograd/profile.h"
#include "tensor/derive_seed.h"
#include "tensor/kernels.h"
#include "tensor/random.h"

namespace lt {

namespace {

// The gradient of the choice (weights) with respect to the raw logits s: through the renormalisation
// and the softmax of s_hat, then the mixing's factor alpha.
struct RouterChoiceNode : Node {
  Tensor probs, expert_ids;
  bool renormalize = false;
  double alpha = 1;
  const char* name() const override { return "router"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dlogits = Tensor::empty_like(probs);
    kernels::router_topk_backward(probs, expert_ids, renormalize, g, alpha, dlogits);
    return {dlogits};
  }
};

// aux = c_b (E / (N^2 k)) sum_{n,e} p[n, e] count_e + c_z (1/N) sum_n lse_n^2, differentiated through
// the softmax of s_hat and the mixing.
struct RouterAuxNode : Node {
  Tensor probs, lse, counts_E;
  double balance_scale = 0, z_scale = 0;  // the factors of the two sums above, times alpha
  const char* name() const override { return "router_aux_loss"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dlogits = Tensor::empty_like(probs);
    kernels::router_aux_backward(probs, lse, counts_E, g, balance_scale, z_scale, dlogits);
    return {dlogits};
  }
};

}  // namespace

Tensor routing_warmup_stats() { return Tensor::from_vector<double>({3}, {0.0, 1.0, 0.0}); }

Tensor warmup_noise(const RouterSettings& settings, int64_t N, int64_t E) {
  LT_CHECK(settings.tokens_per_sequence >= 1, "router: tokens_per_sequence must be positive, got ",
           settings.tokens_per_sequence);
  Tensor eps = Tensor::empty({N, E}, DType::F64);
  double* out = eps.data<double>();
  const uint64_t step_seed = derive_seed(derive_seed(settings.noise_seed, static_cast<uint64_t>(settings.step)),
                                         static_cast<uint64_t>(settings.layer));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t sequence = settings.first_sequence + n / settings.tokens_per_sequence;
    const int64_t position = n % settings.tokens_per_sequence;
    Rng rng(derive_seed(derive_seed(step_seed, static_cast<uint64_t>(sequence)), static_cast<uint64_t>(position)));
    for (int64_t e = 0; e < E; ++e) out[n * E + e] = rng.normal();
  }
  return eps;
}

Routing route(const Variable& x_NH, const Variable& gate_EH, const RouterSettings& settings,
              const Tensor& warmup_stats, Tensor* observations) {
  LT_PROFILE_SCOPE("router");
  const Variable logits = matmul(x_NH, gate_EH, false, true);  // [N, E]
  const Tensor& s = logits.value();
  const int64_t N = s.dim(0), E = s.dim(1), k = settings.top_k;
  LT_CHECK(k >= 1 && k <= E, "router: top_k = ", k, " must be in [1, ", E, "]");
  Routing r;
  r.logits = s;
  double alpha = 1;
  if (settings.training && settings.warmup_steps > 0 && settings.step < settings.warmup_steps) {
    if (observations != nullptr) kernels::routing_warmup_observe(s, warmup_stats, *observations);
    alpha = static_cast<double>(settings.step) / static_cast<double>(settings.warmup_steps);
    // s_hat = alpha s + (1 - alpha)(mu + sigma eps). eps is drawn on the host, per token, in double (a copy
    // to the device, never a wait for it); mu and sigma stay there.
    const Tensor eps = warmup_noise(settings, N, E).to(s.device());
    r.logits = Tensor::empty_like(s);
    kernels::routing_warmup_noise(warmup_stats, eps, alpha, r.logits);
    kernels::axpy(alpha, s, r.logits);
  }

  const bool renormalize = settings.norm_topk_prob && k > 1;
  r.probs = Tensor::empty_like(s);
  r.lse = Tensor::empty({N}, s.dtype(), s.device());
  Tensor weights = Tensor::empty({N, k}, s.dtype(), s.device());
  r.expert_ids = Tensor::empty({N, k}, DType::I32, s.device());
  r.counts_E = Tensor::empty({E}, s.dtype(), s.device());
  r.balance = Tensor::empty({1}, DType::F64, s.device());
  r.z = Tensor::empty({1}, DType::F64, s.device());
  Tensor aux_value = Tensor::empty({1}, s.dtype(), s.device());
  kernels::router_topk_with_aux_loss(r.logits, k, renormalize, settings.aux_loss_coef, settings.z_loss_coef, r.probs,
                                     r.lse, weights, r.expert_ids, r.counts_E, r.balance, r.z, aux_value);

  auto choice = std::make_shared<RouterChoiceNode>();
  auto aux = std::make_shared<RouterAuxNode>();
  if (grad_enabled()) {
    choice->probs = aux->probs = r.probs;
    choice->expert_ids = r.expert_ids;
    choice->renormalize = renormalize;
    choice->alpha = alpha;
    aux->lse = r.lse;
    aux->counts_E = r.counts_E;
    // The factors of router_aux_loss's two sums (E / (N^2 k) and 1 / N), times the coefficients and alpha.
    const double balance_factor = N > 0 ? static_cast<double>(E) / (static_cast<double>(N) * N * k) : 0.0;
    const double z_factor = N > 0 ? 1.0 / static_cast<double>(N) : 0.0;
    aux->balance_scale = alpha * settings.aux_loss_coef * balance_factor;
    aux->z_scale = alpha * settings.z_loss_coef * 2.0 * z_factor;
  }
  r.weights = make_result(weights, choice, {logits});
  r.aux_loss = make_result(aux_value, aux, {logits});
  return r;
}

}  // namespace lt
