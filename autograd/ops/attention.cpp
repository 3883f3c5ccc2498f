// attention: causal grouped-query scaled-dot-product attention, forward and backward.
//
// q [B, T, Hq, D], k and v [B, T, Hkv, D] -> out [B, T, Hq, D], scores scaled by 1/sqrt(D) as in Ling.
// The kernels are flash-style (tensor/cpu/attention.cc): the forward keeps only out and the per-row
// log-sum-exp lse [B, Hq, T], and the backward recomputes the probabilities from them, so the node
// holds O(T) extra memory per head instead of the T x T attention matrix.
#include <cmath>

#include "autograd/ops.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct AttentionNode : Node {
  Tensor q, k, v, out, lse;
  double scale = 0;
  const char* name() const override { return "attention"; }

  // dq, dk and dv come out of one pass over the blocks, so all three are computed even when an input
  // needs no gradient.
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor dq = Tensor::empty_like(q), dk = Tensor::empty_like(k), dv = Tensor::empty_like(v);
    kernels::attention_backward(q, k, v, out, lse, g, scale, dq, dk, dv);
    return {dq, dk, dv};
  }
};

}  // namespace

Variable attention(const Variable& q, const Variable& k, const Variable& v) {
  const Tensor& qv = q.value();
  LT_CHECK(qv.ndim() == 4, "attention: q must be [B, T, Hq, D], got ", qv.str());
  // The kernel checks the rest (k and v against q, Hq a multiple of Hkv) with the same op name.
  const int64_t B = qv.dim(0), T = qv.dim(1), Hq = qv.dim(2), D = qv.dim(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Tensor out = Tensor::empty_like(qv);
  Tensor lse = Tensor::empty({B, Hq, T}, qv.dtype(), qv.device());
  kernels::attention(qv, k.value(), v.value(), scale, out, lse);
  auto node = std::make_shared<AttentionNode>();
  node->scale = scale;
  if (grad_enabled()) {
    node->q = qv;
    node->k = k.value();
    node->v = v.value();
    node->out = out;
    node->lse = lse;
  }
  return make_result(out, node, {q, k, v});
}

}  // namespace lt
