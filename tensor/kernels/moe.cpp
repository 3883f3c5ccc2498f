// The front doors of the MoE router (softmax, top-k and its backward, the auxiliary losses' gradient)
// and of the weighted combine of the experts' outputs (its backward folds in the experts' SwiGLU).
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// y [M, C], w [N, k] with N k = M, pos [N k] i32 positions in [0, M).
void check_combine(const Tensor& y, const Tensor& w, const Tensor& pos, const char* op) {
  check_float(y, op, "y");
  LT_CHECK(y.ndim() == 2, op, ": y must be [M, C], got ", y.str());
  check_like(w, y, op, "w");
  LT_CHECK(w.ndim() == 2 && w.numel() == y.dim(0), op, ": w must be [N, k] with N k = ", y.dim(0), ", got ",
           w.str());
  LT_CHECK(pos.defined() && pos.dtype() == DType::I32 && pos.numel() == w.numel(), op, ": pos must be i32 of ",
           w.numel(), " positions, got ", pos.defined() ? pos.str() : "undefined");
  check_device(pos, y, op, "pos");
  const OutOfRange bad = first_out_of_range(pos, IndexRange{y.dim(0)});
  LT_CHECK(bad.position < 0, op, ": position ", bad.value, " of assignment ", bad.position, " outside [0, ", y.dim(0),
           ")");
}

}  // namespace

void router_topk(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& ids) {
  check_router_topk(logits, k, probs, lse, weights, ids, "router_topk");
  if constexpr (kCudaBackend) {
    if (!logits.is_cpu()) return cuda::router_topk(logits, k, renormalize, probs, lse, weights, ids);
  }
  cpu::router_topk(logits, k, renormalize, probs, lse, weights, ids);
}

void router_topk_backward(const Tensor& probs, const Tensor& ids, bool renormalize, const Tensor& dweights,
                          double scale, Tensor& dlogits) {
  const char* op = "router_topk_backward";
  check_router_rows(probs, ids, op);
  const int64_t k = ids.dim(1);
  check_like(dweights, probs, op, "dweights");
  check_shape(dweights, ids.shape(), op, "dweights");
  check_same(dlogits, probs, op, "dlogits");
  LT_CHECK(k <= kRouterMaxTopK, op, ": k = ", k, " exceeds ", kRouterMaxTopK);
  if constexpr (kCudaBackend) {
    if (!probs.is_cpu()) return cuda::router_topk_backward(probs, ids, renormalize, dweights, scale, dlogits);
  }
  cpu::router_topk_backward(probs, ids, renormalize, dweights, scale, dlogits);
}

void router_aux_backward(const Tensor& probs, const Tensor& lse, const Tensor& counts, const Tensor& upstream,
                         double balance_scale, double z_scale, Tensor& dlogits) {
  const char* op = "router_aux_backward";
  check_probs_and_lse(probs, lse, op);
  const int64_t E = probs.dim(1);
  check_like(counts, probs, op, "counts");
  check_shape(counts, {E}, op, "counts");
  check_like(upstream, probs, op, "upstream");
  check_shape(upstream, {1}, op, "upstream");
  check_same(dlogits, probs, op, "dlogits");
  if constexpr (kCudaBackend) {
    if (!probs.is_cpu()) return cuda::router_aux_backward(probs, lse, counts, upstream, balance_scale, z_scale, dlogits);
  }
  cpu::router_aux_backward(probs, lse, counts, upstream, balance_scale, z_scale, dlogits);
}

void combine_rows(const Tensor& y, const Tensor& w, const Tensor& pos, Tensor& out, double out_beta) {
  const char* op = "combine_rows";
  check_combine(y, w, pos, op);
  check_like(out, y, op, "out");
  check_shape(out, {w.dim(0), y.dim(1)}, op, "out");
  LT_CHECK(out_beta == 0 || out_beta == 1, op, ": out_beta must be 0 or 1, got ", out_beta);
  check_outputs_apart(op, {{&out, "out"}}, {{&y, "y"}, {&w, "w"}, {&pos, "pos"}});
  const bool add_to_out = out_beta == 1;
  if constexpr (kCudaBackend) {
    if (!y.is_cpu()) return cuda::combine_rows(y, w, pos, out, add_to_out);
  }
  cpu::combine_rows(y, w, pos, out, add_to_out);
}

void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate_up, const Tensor& t, Tensor& h,
                             Tensor& dgate_up, Tensor& dw) {
  const char* op = "swiglu_combine_backward";
  check_combine(t, w, pos, op);
  check_kept_anywhere(gate_up, t, op, "gate_up");
  check_gate_up(gate_up, t, t, op, "t");
  check_kept_same(h, t, op, "h");
  check_kept(dgate_up, t, op, "dgate_up");
  check_shape(dgate_up, gate_up.shape(), op, "dgate_up");
  LT_CHECK(dgate_up.dtype() == h.dtype(), op, ": dgate_up ", dgate_up.str(), " and h ", h.str(),
           " must share a dtype (both GEMM operands)");
  check_outputs_apart(op, {{&h, "h"}, {&dgate_up, "dgate_up"}}, {{&gate_up, "gate_up"}, {&t, "t"}, {&w, "w"}});
  if (dw.defined()) {
    check_same(dw, w, op, "dw");
    check_disjoint(dw, w, op, "dw", "w");
  }
  if constexpr (kCudaBackend) {
    if (!t.is_cpu()) return cuda::swiglu_combine_backward(w, pos, gate_up, t, h, dgate_up, dw);
  }
  cpu::swiglu_combine_backward(w, pos, gate_up, t, h, dgate_up, dw);
}

}  // namespace lt::kernels
