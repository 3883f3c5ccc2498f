#include "nn/dpo_loss.h"

#include "autograd/profile.h"

namespace lt {

namespace {
// The forward already holds d loss / d token_logp at an upstream gradient of 1; the backward scales it.
struct DpoLossNode : Node {
  Tensor dtoken_logp;
  const char* name() const override { return "dpo_loss"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor d = Tensor::empty_like(dtoken_logp);
    kernels::scale_by(dtoken_logp, g, 1.0, d);
    return {d};
  }
};
}  // namespace

DpoLoss dpo_loss(const Variable& token_logp, const Tensor& response, const Tensor& counted,
                 const Tensor& reference_logp, double beta, double rpo_alpha) {
  LT_PROFILE_SCOPE("dpo_loss");
  const Tensor& x = token_logp.value();
  DpoLoss out;
  out.stats = Tensor::empty({kernels::kDpoStats}, DType::F64, x.device());
  Tensor loss = Tensor::empty({1}, x.dtype(), x.device());
  auto node = std::make_shared<DpoLossNode>();
  Tensor dx = grad_enabled() && token_logp.requires_grad() ? Tensor::empty_like(x) : Tensor();
  // The pairs' labels are made on the host with the batch; they join the log-probs where those live.
  kernels::dpo_loss(x, response.to(x.device()), counted.to(x.device()), reference_logp.to(x.device()), beta,
                    rpo_alpha, loss, out.stats, dx);
  node->dtoken_logp = dx;
  out.loss = make_result(loss, node, {token_logp});
  return out;
}

}  // namespace lt
