// The attention front doors: causal grouped-query attention, forward and backward.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// Checks the operands shared by forward and backward: q [B, T, Hq, D], k and v [B, T, Hkv, D],
// out like q, lse [B, Hq, T].
void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse) {
  check_float(q, op, "q");
  check_like(k, q, op, "k");
  check_like(v, q, op, "v");
  check_like(out, q, op, "out");
  check_like(lse, q, op, "lse");
  LT_CHECK(q.ndim() == 4, op, ": q must be [B, T, Hq, D], got ", q.str());
  LT_CHECK(k.ndim() == 4, op, ": k must be [B, T, Hkv, D], got ", k.str());
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), D = q.dim(3), Hkv = k.dim(2);
  LT_CHECK(k.dim(0) == B && k.dim(1) == T && k.dim(3) == D, op, ": k ", k.str(), " differs from q ", q.str(),
           " in batch, length or head dim");
  LT_CHECK(Hkv > 0 && Hq % Hkv == 0, op, ": query heads (", Hq, ") must be a multiple of kv heads (", Hkv, ")");
  LT_CHECK(D > 0, op, ": head dim must be positive, got ", q.str());
  check_shape(v, k.shape(), op, "v");
  check_shape(out, q.shape(), op, "out");
  check_shape(lse, {B, Hq, T}, op, "lse");
  require_cpu(q, op);
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse) {
  check_attention("attention", q, k, v, out, lse);
  cpu::attention(q, k, v, scale, out, lse);
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const char* op = "attention_backward";
  check_attention(op, q, k, v, out, lse);
  check_same(dout, q, op, "dout");
  check_same(dq, q, op, "dq");
  check_same(dk, k, op, "dk");
  check_same(dv, k, op, "dv");
  cpu::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv);
}

}  // namespace lt::kernels
