// matmul: forward and backward for every transpose combination.
//
// With c = op(a) op(b) and incoming gradient g = dL/dc:
//   d op(a) = g op(b)^T,   d op(b) = op(a)^T g.
// Each is written as one GEMM straight into the layout of a or b, choosing the transpose flags so that
// no transposed copy is ever materialised.
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "autograd/saved.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct MatmulNode : Node {
  SavedTensor saved_a, saved_b;
  bool trans_a, trans_b;
  const char* name() const override { return "matmul"; }

  // Each gradient is one GEMM into its target: a weight's gradient accumulates straight into the
  // leaf's gradient buffer (beta 1 after the first contribution), so it is never copied.
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor da, db;
    const Tensor b = saved_b.get();
    if (needs_grad(0)) {
      GradTarget t = grad_target(0, saved_a.stored().shape(), g.dtype(), g.device());
      // a stored [M, K]: da = g b^T (b [K, N]) or g b (b stored [N, K]);
      // a stored [K, M]: da = b g^T or b^T g^T.
      if (!trans_a) kernels::matmul(g, false, b, !trans_b, t.tensor, 1.0, t.beta);
      else kernels::matmul(b, trans_b, g, true, t.tensor, 1.0, t.beta);
      da = t.returned();
    }
    if (needs_grad(1)) {
      const Tensor a = saved_a.get();
      GradTarget t = grad_target(1, b);
      if (b.ndim() == 2 && a.ndim() == 3) {
        // b applied to every batch: flatten the batch into rows, one GEMM over [G*M, K] and [G*M, N].
        const Tensor a2 = a.reshape({-1, a.dim(-1)});
        const Tensor g2 = g.reshape({-1, g.dim(-1)});
        if (!trans_b) kernels::matmul(a2, true, g2, false, t.tensor, 1.0, t.beta);  // db [K, N] = a^T g
        else kernels::matmul(g2, true, a2, false, t.tensor, 1.0, t.beta);           // db [N, K] = g^T a
      } else {
        if (!trans_b) kernels::matmul(a, !trans_a, g, false, t.tensor, 1.0, t.beta);  // db [K, N] = op(a)^T g
        else kernels::matmul(g, true, a, trans_a, t.tensor, 1.0, t.beta);             // db [N, K] = g^T op(a)
      }
      db = t.returned();
    }
    return {da, db};
  }
};

}  // namespace

Variable matmul(const Variable& a, const Variable& b, bool trans_a, bool trans_b) {
  LT_PROFILE_SCOPE("matmul");
  const Tensor& av = a.value();
  const Tensor& bv = b.value();
  LT_CHECK(av.ndim() >= 2 && bv.ndim() >= 2, "matmul: operands must be at least 2-D: ", av.str(), ", ", bv.str());
  LT_CHECK(!(av.ndim() == 3 && bv.ndim() == 2 && trans_a), "matmul: a batched a against a shared b cannot be transposed");
  const int64_t M = trans_a ? av.dim(-1) : av.dim(-2);
  const int64_t N = trans_b ? bv.dim(-2) : bv.dim(-1);
  Shape out_shape = av.ndim() == 3 ? Shape{av.dim(0), M, N} : Shape{M, N};
  Tensor out = Tensor::empty(out_shape, av.dtype(), av.device());
  kernels::matmul(av, trans_a, bv, trans_b, out);
  auto node = std::make_shared<MatmulNode>();
  node->trans_a = trans_a;
  node->trans_b = trans_b;
  if (grad_enabled()) {
    node->saved_a = SavedTensor::input(a);
    node->saved_b = SavedTensor::input(b);
  }
  return make_result(out, node, {a, b});
}

}  // namespace lt
