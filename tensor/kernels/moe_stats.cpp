// The front doors of the MoE statistics and dispatch kernels (tensor/kernels.h, "MoE statistics and
// dispatch"): the routing-warmup statistics and noise, the router's auxiliary-loss sums (alone, or with
// the choice of experts they are taken over), the routing entropy, the dispatch's counting sort and the
// grouped GEMMs over its segments.
#include <limits>
#include <vector>

#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// A one- or few-element f64 result on the device of `ref` (the statistics live beside the routing).
void check_f64(const Tensor& t, const Shape& shape, const Tensor& ref, const char* op, const char* what) {
  LT_CHECK(t.defined() && t.dtype() == DType::F64 && t.device() == ref.device(), op, ": ", what, " must be f64 on ",
           ref.device().str(), ", got ", t.defined() ? t.str() : "undefined");
  check_shape(t, shape, op, what);
}

// ids i32 [N, k] of experts in [0, E).
void check_expert_ids(const Tensor& ids, int64_t N, int64_t E, const char* op) {
  LT_CHECK(ids.defined() && ids.dtype() == DType::I32 && ids.ndim() == 2 && (N < 0 || ids.dim(0) == N), op,
           ": ids must be i32 [N, k], got ", ids.defined() ? ids.str() : "undefined");
  const OutOfRange bad = first_out_of_range(ids, IndexRange{E});
  LT_CHECK(bad.position < 0, op, ": expert id ", bad.value, " outside [0, ", E, ")");
}

// The offsets of a dispatch on the host: host_offsets where the caller has them (then nothing waits for
// the device), else a copy of offsets (the same tensor on the CPU). cuBLAS takes its group sizes there.
Tensor host_segment_offsets(const Tensor& offsets, const Tensor& host_offsets, const Tensor& a, const char* op) {
  LT_CHECK(offsets.defined() && offsets.dtype() == DType::I64 && offsets.ndim() == 1, op,
           ": offsets must be i64 [E + 1], got ", offsets.defined() ? offsets.str() : "undefined");
  check_device(offsets, a, op, "offsets");
  if (!host_offsets.defined()) return offsets.to(Device::cpu());
  LT_CHECK(host_offsets.is_cpu() && host_offsets.dtype() == DType::I64 && host_offsets.shape() == offsets.shape(), op,
           ": host_offsets must be the offsets' i64 ", shape_str(offsets.shape()), " copy on the CPU, got ",
           host_offsets.str());
  return host_offsets;
}

// The expert segments of a dispatch, on their host copy: E + 1 offsets, non-decreasing from 0 to `rows`.
void check_segments(const Tensor& host_offsets, int64_t E, int64_t rows, const char* op) {
  check_shape(host_offsets, {E + 1}, op, "offsets");
  const int64_t* off = host_offsets.data<int64_t>();
  LT_CHECK(off[0] == 0 && off[E] == rows, op, ": offsets span [", off[0], ", ", off[E], "), expected [0, ", rows, ")");
  for (int64_t e = 0; e < E; ++e)
    LT_CHECK(off[e] <= off[e + 1], op, ": offsets decrease at expert ", e, " (", off[e], " > ", off[e + 1], ")");
}

// router_aux_loss's outputs for probs [N, E] and N k assignments: counts [E] and aux [1] in probs' dtype,
// balance and z f64 [1].
void check_aux_loss_outputs(const Tensor& probs, int64_t assignments, const Tensor& counts, const Tensor& balance,
                            const Tensor& z, const Tensor& aux, const char* op) {
  check_like(counts, probs, op, "counts");
  check_shape(counts, {probs.dim(1)}, op, "counts");
  check_f64(balance, {1}, probs, op, "balance");
  check_f64(z, {1}, probs, op, "z");
  check_like(aux, probs, op, "aux");
  check_shape(aux, {1}, op, "aux");
  // Every count is at most N k: below the largest integer that the float dtype holds exactly, no count
  // rounds (f32: 2^24 assignments per routing).
  const int64_t exact = probs.dtype() == DType::F32 ? int64_t{1} << std::numeric_limits<float>::digits
                                                    : int64_t{1} << std::numeric_limits<double>::digits;
  LT_CHECK(assignments <= exact, op, ": ", assignments, " assignments exceed the exact integers of ",
           dtype_name(probs.dtype()));
}

}  // namespace

void routing_warmup_observe(const Tensor& logits, const Tensor& stats, Tensor& observations) {
  const char* op = "routing_warmup_observe";
  check_float(logits, op, "logits");
  check_f64(stats, {3}, logits, op, "stats");
  check_f64(observations, {3}, logits, op, "observations");
  check_outputs_apart(op, {{&observations, "observations"}}, {{&stats, "stats"}});
  if (logits.numel() == 0) return;
  if constexpr (kCudaBackend) {
    if (!logits.is_cpu()) return cuda::routing_warmup_observe(logits, stats, observations);
  }
  cpu::routing_warmup_observe(logits, stats, observations);
}

void routing_warmup_fold(Tensor& observations, double momentum, Tensor& stats) {
  const char* op = "routing_warmup_fold";
  LT_CHECK(stats.defined() && stats.dtype() == DType::F64 && stats.shape() == Shape{3}, op,
           ": stats must be f64 [3], got ", stats.defined() ? stats.str() : "undefined");
  check_f64(observations, {3}, stats, op, "observations");
  check_outputs_apart(op, {{&observations, "observations"}, {&stats, "stats"}}, {});
  LT_CHECK(momentum >= 0 && momentum <= 1, op, ": momentum must be in [0, 1], got ", momentum);
  if constexpr (kCudaBackend) {
    if (!stats.is_cpu()) return cuda::routing_warmup_fold(observations, momentum, stats);
  }
  cpu::routing_warmup_fold(observations, momentum, stats);
}

void routing_warmup_noise(const Tensor& stats, const Tensor& eps, double alpha, Tensor& noise) {
  const char* op = "routing_warmup_noise";
  check_float(noise, op, "noise");
  check_f64(stats, {3}, noise, op, "stats");
  check_f64(eps, noise.shape(), noise, op, "eps");
  if constexpr (kCudaBackend) {
    if (!noise.is_cpu()) return cuda::routing_warmup_noise(stats, eps, alpha, noise);
  }
  cpu::routing_warmup_noise(stats, eps, alpha, noise);
}

void router_aux_loss(const Tensor& probs, const Tensor& lse, const Tensor& ids, double balance_coef, double z_coef,
                     Tensor& counts, Tensor& balance, Tensor& z, Tensor& aux) {
  const char* op = "router_aux_loss";
  check_probs_and_lse(probs, lse, op);
  check_expert_ids(ids, probs.dim(0), probs.dim(1), op);
  check_device(ids, probs, op, "ids");
  check_aux_loss_outputs(probs, ids.numel(), counts, balance, z, aux, op);
  if constexpr (kCudaBackend) {
    if (!probs.is_cpu()) return cuda::router_aux_loss(probs, lse, ids, balance_coef, z_coef, counts, balance, z, aux);
  }
  cpu::router_aux_loss(probs, lse, ids, balance_coef, z_coef, counts, balance, z, aux);
}

void router_topk_with_aux_loss(const Tensor& logits, int64_t k, bool renormalize, double balance_coef, double z_coef,
                               Tensor& probs, Tensor& lse, Tensor& weights, Tensor& ids, Tensor& counts,
                               Tensor& balance, Tensor& z, Tensor& aux) {
  const char* op = "router_topk_with_aux_loss";
  check_router_topk(logits, k, probs, lse, weights, ids, op);
  check_aux_loss_outputs(probs, ids.numel(), counts, balance, z, aux, op);
  if constexpr (kCudaBackend) {
    if (!logits.is_cpu())
      return cuda::router_topk_with_aux_loss(logits, k, renormalize, balance_coef, z_coef, probs, lse, weights, ids,
                                             counts, balance, z, aux);
  }
  cpu::router_topk_with_aux_loss(logits, k, renormalize, balance_coef, z_coef, probs, lse, weights, ids, counts,
                                 balance, z, aux);
}

void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit) {
  const char* op = "routing_entropy";
  check_probs_and_lse(probs, lse, op);
  check_same(logits, probs, op, "logits");
  check_f64(entropy, {1}, probs, op, "entropy");
  check_f64(max_logit, {1}, probs, op, "max_logit");
  if constexpr (kCudaBackend) {
    if (!probs.is_cpu()) return cuda::routing_entropy(probs, logits, lse, entropy, max_logit);
  }
  cpu::routing_entropy(probs, logits, lse, entropy, max_logit);
}

void dispatch_plan(const Tensor& ids, Tensor& token_of, Tensor& position_of, Tensor& offsets) {
  const char* op = "dispatch_plan";
  LT_CHECK(offsets.defined() && offsets.dtype() == DType::I64 && offsets.ndim() == 1 && offsets.numel() >= 1 &&
               offsets.device() == ids.device(),
           op, ": offsets must be i64 [E + 1] on ", ids.device().str(), ", got ",
           offsets.defined() ? offsets.str() : "undefined");
  check_expert_ids(ids, -1, offsets.numel() - 1, op);
  const int64_t M = ids.numel();
  LT_CHECK(M <= std::numeric_limits<int32_t>::max(), op, ": ", M, " assignments do not fit i32 rows");
  check_like(token_of, ids, op, "token_of");
  check_shape(token_of, {M}, op, "token_of");
  check_like(position_of, ids, op, "position_of");
  check_shape(position_of, {M}, op, "position_of");
  if constexpr (kCudaBackend) {
    if (!ids.is_cpu()) return cuda::dispatch_plan(ids, token_of, position_of, offsets);
  }
  cpu::dispatch_plan(ids, token_of, position_of, offsets);
}

void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& offsets, Tensor& out, double beta) {
  grouped_matmuls({{a, w, trans_w, out, beta}}, offsets);
}

namespace {

// The rows of a grouped operand: a's own (undefined rows), or, with rows (i32 [M], each in [0, a.dim(0))),
// M rows read through them. Returns M.
int64_t checked_operand_rows(const Tensor& a, const Tensor& rows, const char* op, const char* what) {
  LT_CHECK(a.ndim() == 2, op, ": ", what, " must be 2-D, got ", a.str());
  if (!rows.defined()) return a.dim(0);
  LT_CHECK(rows.dtype() == DType::I32 && rows.ndim() == 1 && rows.device() == a.device(), op, ": the rows of ", what,
           " must be i32 [M] on ", a.device().str(), ", got ", rows.str());
  check_indices(rows, a.dim(0), op);
  return rows.numel();
}

// The CUDA path multiplies whole matrices (cuBLAS): an operand gathered by row is gathered first, once
// per distinct operand and index of a call (two products of one call may read the same x through the same
// token_of). Under mixed precision an f32 operand is gathered into bf16,
// the rounding that the GEMM would make in a pass of its own.
class GatheredCopies {
 public:
  Tensor of(const Tensor& a, const Tensor& rows) {
    if (!rows.defined()) return a;
    for (const Copy& c : copies_)
      if (c.a.raw_data() == a.raw_data() && c.a.shape() == a.shape() && c.rows.raw_data() == rows.raw_data() &&
          c.rows.numel() == rows.numel())
        return c.copy;
    const bool rounded = a.dtype() == DType::F32 && matmul_precision() == MatmulPrecision::BF16Inputs;
    Tensor copy = Tensor::empty({rows.numel(), a.dim(1)}, rounded ? DType::BF16 : a.dtype(), a.device());
    gather_rows(a, rows, copy);
    copies_.push_back({a, rows, copy});
    return copy;
  }

 private:
  struct Copy {
    Tensor a, rows, copy;
  };
  std::vector<Copy> copies_;
};

}  // namespace

void grouped_matmuls(const std::vector<GroupedProduct>& products, const Tensor& offsets, const Tensor& host_offsets) {
  const char* op = "grouped_matmul";
  LT_CHECK(!products.empty(), op, ": no products");
  const Tensor host = host_segment_offsets(offsets, host_offsets, products.front().a, op);
  // a as autograd kept it or as its producer wrote it for the GEMM: under mixed precision a bf16 copy
  // (check_kept_anywhere), which the GEMM takes as it is.
  for (const auto& [a, w, trans_w, out, beta, a_rows] : products) {
    check_float(out, op, "out");
    check_like(out, products.front().out, op, "out of every product");
    check_like(w, out, op, "w");
    check_kept_anywhere(a, out, op, "a");
    const int64_t M = checked_operand_rows(a, a_rows, op, "a");
    LT_CHECK(w.ndim() == 3 && out.ndim() == 2 && out.dim(0) == M && a.dim(1) == w.dim(trans_w ? 2 : 1) &&
                 out.dim(1) == w.dim(trans_w ? 1 : 2),
             op, ": a ", a.str(), (a_rows.defined() ? " (gathered)" : ""), ", w ", w.str(),
             (trans_w ? " (transposed)" : ""), " and out ", out.str(), " do not fit");
    check_segments(host, w.dim(0), M, op);
  }
  if constexpr (kCudaBackend) {
    if (!products.front().a.is_cpu()) {
      GatheredCopies copies;
      std::vector<GroupedProduct> gathered;
      for (const GroupedProduct& p : products)
        gathered.push_back({copies.of(p.a, p.a_rows), p.w, p.trans_w, p.out, p.beta});
      return cuda::grouped_matmuls(gathered, offsets, host, matmul_precision());
    }
  }
  cpu::grouped_matmuls(products, offsets, matmul_precision());
}

void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& offsets, Tensor& dw, double beta) {
  grouped_weight_grads({{a, b, dw, beta}}, offsets);
}

void grouped_weight_grads(const std::vector<GroupedWeightGrad>& grads, const Tensor& offsets,
                          const Tensor& host_offsets) {
  const char* op = "grouped_weight_grad";
  LT_CHECK(!grads.empty(), op, ": no gradients");
  const Tensor host = host_segment_offsets(offsets, host_offsets, grads.front().a, op);
  // a and b as kept or written for the GEMM (grouped_matmuls).
  for (const auto& [a, b, dw, beta, a_rows, b_rows] : grads) {
    check_float(dw, op, "dw");
    check_like(dw, grads.front().dw, op, "dw of every gradient");
    check_kept_anywhere(a, dw, op, "a");
    check_kept_anywhere(b, dw, op, "b");
    const int64_t M = checked_operand_rows(a, a_rows, op, "a");
    LT_CHECK(checked_operand_rows(b, b_rows, op, "b") == M && dw.ndim() == 3 && dw.dim(1) == a.dim(1) &&
                 dw.dim(2) == b.dim(1),
             op, ": a ", a.str(), (a_rows.defined() ? " (gathered)" : ""), ", b ", b.str(),
             (b_rows.defined() ? " (gathered)" : ""), " and dw ", dw.str(), " do not fit ([M, P], [M, Q], [E, P, Q])");
    LT_CHECK(beta == 0 || beta == 1, op, ": beta must be 0 or 1, got ", beta);
    check_segments(host, dw.dim(0), M, op);
  }
  if constexpr (kCudaBackend) {
    if (!grads.front().a.is_cpu()) {
      GatheredCopies copies;
      std::vector<GroupedWeightGrad> gathered;
      for (const GroupedWeightGrad& g : grads)
        gathered.push_back({copies.of(g.a, g.a_rows), copies.of(g.b, g.b_rows), g.dw, g.beta});
      return cuda::grouped_weight_grads(gathered, offsets, host, matmul_precision());
    }
  }
  cpu::grouped_weight_grads(grads, offsets, matmul_precision());
}

void accumulate_f64(const Tensor& x, Tensor& sum) {
  const char* op = "accumulate_f64";
  check_float(x, op, "x");
  LT_CHECK(sum.defined() && sum.dtype() == DType::F64 && sum.device() == x.device() && sum.numel() == x.numel(), op,
           ": sum must be f64 of ", x.numel(), " elements on ", x.device().str(), ", got ",
           sum.defined() ? sum.str() : "undefined");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::accumulate_f64(x, sum);
  }
  cpu::accumulate_f64(x, sum);
}

}  // namespace lt::kernels
