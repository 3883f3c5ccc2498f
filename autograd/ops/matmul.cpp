// matmul: forward and backward for every transpose combination.
//
// With c = op(a) op(b) and incoming gradient g = dL/dc:
//   d op(a) = g op(b)^T,   d op(b) = op(a)^T g.
// Each is written as one GEMM straight into the layout of a or b, choosing the transpose flags so that
// no transposed copy is ever materialised. matmul_add's addend, c = op(a) op(b) + addend, receives g
// itself, as add's operands do.
#include "autograd/ops.h"
#include "autograd/profile.h"
#include "autograd/saved.h"
#include "tensor/kernels.h"

namespace lt {
namespace {

struct MatmulNode : Node {
  SavedTensor saved_a, saved_b;
  bool trans_a, trans_b;
  bool has_addend = false;
  const char* name() const override { return has_addend ? "matmul_add" : "matmul"; }
  // matmul_add hands its gradient on to the addend as well.
  bool reads_gradient_in_gemms_only() const override { return !has_addend; }

  // Each gradient is one GEMM into its target: a weight's gradient accumulates straight into the
  // leaf's gradient buffer (beta 1 after the first contribution), so it is never copied.
  // The operands as kept: under mixed precision an activation's bf16 copy, which the GEMMs take as it is,
  // and g rounded once for both products, or already rounded by its producer (input_gradient_dtype),
  // when the inputs' gradients are f32.
  std::vector<Tensor> backward(const Tensor& g_kept) override {
    Tensor da, db;
    const Tensor& b = saved_b.stored();
    const Tensor g = gemm_operand(g_kept);
    const DType grad_dtype = g_kept.dtype() == DType::BF16 ? DType::F32 : g_kept.dtype();
    const size_t a_input = has_addend ? 1 : 0, b_input = a_input + 1;
    if (needs_grad(a_input)) {
      GradTarget t = grad_target(a_input, saved_a.stored().shape(), grad_dtype, g_kept.device());
      // a stored [M, K]: da = g b^T (b [K, N]) or g b (b stored [N, K]);
      // a stored [K, M]: da = b g^T or b^T g^T.
      if (!trans_a) kernels::matmul(g, false, b, !trans_b, t.tensor, 1.0, t.beta);
      else kernels::matmul(b, trans_b, g, true, t.tensor, 1.0, t.beta);
      da = t.returned();
    }
    if (needs_grad(b_input)) {
      const Tensor& a = saved_a.stored();
      GradTarget t = grad_target(b_input, b.shape(), grad_dtype, g_kept.device());
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
    if (has_addend) return {g_kept, da, db};
    return {da, db};
  }
};

// The product's shape, op(a) op(b), checked.
Shape product_shape(const char* op, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  LT_CHECK(a.ndim() >= 2 && b.ndim() >= 2, op, ": operands must be at least 2-D: ", a.str(), ", ", b.str());
  LT_CHECK(!(a.ndim() == 3 && b.ndim() == 2 && trans_a), op, ": a batched a against a shared b cannot be transposed");
  const int64_t M = trans_a ? a.dim(-1) : a.dim(-2);
  const int64_t N = trans_b ? b.dim(-2) : b.dim(-1);
  return a.ndim() == 3 ? Shape{a.dim(0), M, N} : Shape{M, N};
}

// The node, keeping its operands where gradients are on. Made before the product, so that the forward
// GEMM reads the operands as kept: under mixed precision the bf16 copies it would otherwise round again.
std::shared_ptr<MatmulNode> matmul_node(const Variable& a, const Variable& b, bool trans_a, bool trans_b,
                                        bool has_addend) {
  auto node = std::make_shared<MatmulNode>();
  node->trans_a = trans_a;
  node->trans_b = trans_b;
  node->has_addend = has_addend;
  if (grad_enabled()) {
    node->saved_a = SavedTensor::input(a);
    node->saved_b = SavedTensor::input(b);
  }
  return node;
}

}  // namespace

Variable matmul(const Variable& a, const Variable& b, bool trans_a, bool trans_b) {
  LT_PROFILE_SCOPE("matmul");
  const Tensor& av = a.value();
  Tensor out = Tensor::empty(product_shape("matmul", av, b.value(), trans_a, trans_b), av.dtype(), av.device());
  const auto node = matmul_node(a, b, trans_a, trans_b, false);
  kernels::matmul(forward_operand(node->saved_a, a), trans_a, forward_operand(node->saved_b, b), trans_b, out);
  return make_result(out, node, {a, b});
}

// The addend is the first input, as in add(addend, product): the engine then runs the product's side of the
// graph first, in the order of the separate add (and so with its peak memory).
Variable matmul_add(const Variable& a, const Variable& b, const Variable& addend, bool trans_a, bool trans_b) {
  LT_PROFILE_SCOPE("matmul_add");
  const Tensor& av = a.value();
  Tensor out = Tensor::empty(product_shape("matmul_add", av, b.value(), trans_a, trans_b), av.dtype(), av.device());
  const auto node = matmul_node(a, b, trans_a, trans_b, true);
  kernels::matmul_add(forward_operand(node->saved_a, a), trans_a, forward_operand(node->saved_b, b), trans_b,
                      addend.value(), out);
  return make_result(out, node, {addend, a, b});
}

}  // namespace lt
