#include "moe/router.h"

#include <cmath>
#include <type_traits>

#include "autograd/ops.h"
#include "autograd/profile.h"
#include "tensor/kernels.h"

namespace lt {

namespace {

// fn(values, count) on a CPU tensor's elements as float or double.
template <class Fn>
void with_float_values(const Tensor& t, const Fn& fn) {
  LT_CHECK(t.is_cpu(), "router: logits must be on the CPU, got ", t.str());
  if (t.dtype() == DType::F32) fn(t.data<float>(), t.numel());
  else fn(t.data<double>(), t.numel());
}

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
    const double upstream = g.item();
    Tensor dlogits = Tensor::empty_like(probs);
    kernels::router_aux_backward(probs, lse, counts_E, upstream * balance_scale, upstream * z_scale, dlogits);
    return {dlogits};
  }
};

}  // namespace

void RoutingWarmup::observe(const Tensor& logits) {
  if (logits.numel() == 0) return;
  double batch_mean = 0, batch_std = 0;
  with_float_values(logits, [&](const auto* values, int64_t n) {
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) sum += values[i];
    batch_mean = sum / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) sum_sq += (values[i] - batch_mean) * (values[i] - batch_mean);
    batch_std = std::sqrt(sum_sq / static_cast<double>(n));
  });
  if (!initialized) {
    mean = batch_mean;
    std = batch_std;
    initialized = true;
    return;
  }
  mean = kMomentum * mean + (1 - kMomentum) * batch_mean;
  std = kMomentum * std + (1 - kMomentum) * batch_std;
}

Routing route(const Variable& x_NH, const Variable& gate_EH, const RouterSettings& settings, RoutingWarmup& warmup,
              Rng& rng) {
  LT_PROFILE_SCOPE("router");
  const Variable logits = matmul(x_NH, gate_EH, false, true);  // [N, E]
  const Tensor& s = logits.value();
  const int64_t N = s.dim(0), E = s.dim(1), k = settings.top_k;
  LT_CHECK(k >= 1 && k <= E, "router: top_k = ", k, " must be in [1, ", E, "]");
  Routing r;
  r.logits = s;
  double alpha = 1;
  if (settings.training && settings.warmup_steps > 0 && settings.step < settings.warmup_steps) {
    if (settings.update_warmup_stats) warmup.observe(s);
    alpha = static_cast<double>(settings.step) / static_cast<double>(settings.warmup_steps);
    // s_hat = alpha s + (1 - alpha)(mu + sigma eps), eps drawn in element order from the trainer's generator.
    r.logits = Tensor::empty_like(s);
    with_float_values(r.logits, [&](auto* values, int64_t n) {
      using T = std::remove_cv_t<std::remove_pointer_t<decltype(values)>>;
      for (int64_t i = 0; i < n; ++i)
        values[i] = static_cast<T>((1 - alpha) * (warmup.mean + warmup.std * rng.normal()));
    });
    kernels::axpy(alpha, s, r.logits);
  }

  const bool renormalize = settings.norm_topk_prob && k > 1;
  r.probs = Tensor::empty_like(s);
  r.lse = Tensor::empty({N}, s.dtype(), s.device());
  Tensor weights = Tensor::empty({N, k}, s.dtype(), s.device());
  r.expert_ids = Tensor::empty({N, k}, DType::I32, s.device());
  kernels::router_topk(r.logits, k, renormalize, r.probs, r.lse, weights, r.expert_ids);
  r.expert_counts.assign(static_cast<size_t>(E), 0);
  const int32_t* ids = r.expert_ids.data<int32_t>();
  for (int64_t a = 0; a < N * k; ++a) ++r.expert_counts[static_cast<size_t>(ids[a])];

  // balance = E / (N^2 k) sum_e count_e sum_n p[n, e], z = (1/N) sum_n lse_n^2, summed in f64.
  with_float_values(r.probs, [&](const auto* p, int64_t) {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) r.balance += static_cast<double>(p[n * E + e]) * r.expert_counts[e];
  });
  with_float_values(r.lse, [&](const auto* l, int64_t) {
    for (int64_t n = 0; n < N; ++n) r.z += static_cast<double>(l[n]) * l[n];
  });
  const double balance_factor = N > 0 ? static_cast<double>(E) / (static_cast<double>(N) * N * k) : 0.0;
  const double z_factor = N > 0 ? 1.0 / static_cast<double>(N) : 0.0;
  r.balance *= balance_factor;
  r.z *= z_factor;

  auto choice = std::make_shared<RouterChoiceNode>();
  auto aux = std::make_shared<RouterAuxNode>();
  if (grad_enabled()) {
    choice->probs = aux->probs = r.probs;
    choice->expert_ids = r.expert_ids;
    choice->renormalize = renormalize;
    choice->alpha = alpha;
    aux->lse = r.lse;
    std::vector<double> counts(r.expert_counts.begin(), r.expert_counts.end());
    aux->counts_E = Tensor::from_vector<double>({E}, counts).to(s.dtype());
    aux->balance_scale = alpha * settings.aux_loss_coef * balance_factor;
    aux->z_scale = alpha * settings.z_loss_coef * 2.0 * z_factor;
  }
  r.weights = make_result(weights, choice, {logits});
  const Tensor aux_value =
      Tensor::full({1}, settings.aux_loss_coef * r.balance + settings.z_loss_coef * r.z, s.dtype(), s.device());
  r.aux_loss = make_result(aux_value, aux, {logits});
  return r;
}

}  // namespace lt
