// The preference-loss front door.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

void dpo_loss(const Tensor& token_logp, const Tensor& response, const Tensor& counted, const Tensor& reference_logp,
              double beta, double rpo_alpha, Tensor& loss, Tensor& stats, Tensor& dtoken_logp) {
  const char* op = "dpo_loss";
  check_float(token_logp, op, "token_logp");
  LT_CHECK(token_logp.ndim() == 1, op, ": token_logp must be [N], got ", token_logp.str());
  const int64_t N = token_logp.numel();
  for (const auto& [t, what] : {std::pair{&response, "response"}, std::pair{&counted, "counted"}}) {
    LT_CHECK(t->defined() && t->dtype() == DType::I32 && t->shape() == Shape{N}, op, ": ", what, " must be i32 [", N,
             "], got ", t->defined() ? t->str() : "undefined");
    check_device(*t, token_logp, op, what);
  }
  LT_CHECK(reference_logp.defined() && reference_logp.dtype() == DType::F64 && reference_logp.ndim() == 1 &&
               reference_logp.numel() % 2 == 0,
           op, ": reference_logp must be f64 [2P], got ", reference_logp.defined() ? reference_logp.str() : "undefined");
  check_device(reference_logp, token_logp, op, "reference_logp");
  LT_CHECK(beta > 0, op, ": beta must be > 0, got ", beta);
  LT_CHECK(rpo_alpha >= 0, op, ": rpo_alpha must be >= 0, got ", rpo_alpha);
  check_like(loss, token_logp, op, "loss");
  LT_CHECK(loss.numel() == 1, op, ": loss must hold one element, got ", loss.str());
  LT_CHECK(stats.defined() && stats.dtype() == DType::F64 && stats.numel() == kDpoStats, op, ": stats must be f64 [",
           static_cast<int>(kDpoStats), "]");
  if (dtoken_logp.defined()) check_same(dtoken_logp, token_logp, op, "dtoken_logp");
  check_device(stats, token_logp, op, "stats");
  const int64_t pairs = reference_logp.numel() / 2;
  const OutOfRange bad = first_out_of_range(response, IndexRange{2 * pairs, true, -1});
  LT_CHECK(bad.position < 0, op, ": response id ", bad.value, " (token ", bad.position, ") is outside [-1, ",
           2 * pairs, ")");
  if constexpr (kCudaBackend) {
    if (!token_logp.is_cpu())
      return cuda::dpo_loss(token_logp, response, counted, reference_logp, beta, rpo_alpha, loss, stats, dtoken_logp);
  }
  cpu::dpo_loss(token_logp, response, counted, reference_logp, beta, rpo_alpha, loss, stats, dtoken_logp);
}

}  // namespace lt::kernels
