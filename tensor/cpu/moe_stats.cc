// The MoE statistics and dispatch kernels: the routing-warmup statistics and noise, the router's
// auxiliary-loss sums, the routing entropy, the dispatch's counting sort and the grouped GEMMs over its
// segments. The sums are plain f64 loops in element order on one thread (the order is what makes them
// deterministic and equal to the host loops they replaced); they touch N x E values once, next to the
// router's own passes over the same data.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor/cpu/kernel_util.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

namespace lt::kernels {
namespace {

// A one- or few-element f64 result on the device of `ref` (the statistics live beside the routing).
void check_f64(const Tensor& t, const Shape& shape, const Tensor& ref, const char* op, const char* what) {
  LT_CHECK(t.defined() && t.dtype() == DType::F64 && t.device() == ref.device(), op, ": ", what, " must be f64 on ",
           ref.device().str(), ", got ", t.defined() ? t.str() : "undefined");
  check_shape(t, shape, op, what);
}

void check_ids(const Tensor& ids, int64_t N, const char* op) {
  LT_CHECK(ids.defined() && ids.dtype() == DType::I32 && ids.ndim() == 2 && ids.dim(0) == N, op,
           ": ids must be i32 [", N, ", k], got ", ids.defined() ? ids.str() : "undefined");
}

// The expert segments of a dispatch: offsets i64 [E + 1], non-decreasing from 0 to `rows`. Read on the
// host: the grouped GEMM's CPU backend loops over the segments itself.
const int64_t* segment_offsets(const Tensor& offsets, int64_t E, int64_t rows, const char* op) {
  LT_CHECK(offsets.defined() && offsets.dtype() == DType::I64, op, ": offsets must be i64, got ",
           offsets.defined() ? offsets.str() : "undefined");
  check_shape(offsets, {E + 1}, op, "offsets");
  require_cpu(offsets, op);
  const int64_t* off = offsets.data<int64_t>();
  LT_CHECK(off[0] == 0 && off[E] == rows, op, ": offsets span [", off[0], ", ", off[E], "), expected [0, ", rows, ")");
  for (int64_t e = 0; e < E; ++e)
    LT_CHECK(off[e] <= off[e + 1], op, ": offsets decrease at expert ", e, " (", off[e], " > ", off[e + 1], ")");
  return off;
}

}  // namespace

void routing_warmup_observe(const Tensor& logits, double momentum, Tensor& stats) {
  const char* op = "routing_warmup_observe";
  check_float(logits, op, "logits");
  require_cpu(logits, op);
  check_f64(stats, {3}, logits, op, "stats");
  const int64_t n = logits.numel();
  if (n == 0) return;
  double* st = stats.data<double>();
  LT_FLOAT_SWITCH(logits.dtype(), T, {
    const T* s = logits.data<T>();
    // Two passes (mean, then squared deviations) rather than sum and sum of squares: no cancellation
    // when the logits sit far from zero.
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) sum += s[i];
    const double mean = sum / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) sum_sq += (s[i] - mean) * (s[i] - mean);
    const double std = std::sqrt(sum_sq / static_cast<double>(n));
    if (st[2] == 0) {
      st[0] = mean;
      st[1] = std;
      st[2] = 1;
    } else {
      st[0] = momentum * st[0] + (1 - momentum) * mean;
      st[1] = momentum * st[1] + (1 - momentum) * std;
    }
  });
}

void routing_warmup_noise(const Tensor& stats, const Tensor& eps, double alpha, Tensor& noise) {
  const char* op = "routing_warmup_noise";
  check_float(noise, op, "noise");
  require_cpu(noise, op);
  check_f64(stats, {3}, noise, op, "stats");
  check_f64(eps, noise.shape(), noise, op, "eps");
  const double mean = stats.data<double>()[0], std = stats.data<double>()[1];
  const double* e = eps.data<double>();
  LT_FLOAT_SWITCH(noise.dtype(), T, {
    T* out = noise.data<T>();
    parallel_for(noise.numel(), 4096, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = static_cast<T>((1 - alpha) * (mean + std * e[i]));
    });
  });
}

void router_aux_loss(const Tensor& probs, const Tensor& lse, const Tensor& ids, double balance_coef, double z_coef,
                     Tensor& counts, Tensor& balance, Tensor& z, Tensor& aux) {
  const char* op = "router_aux_loss";
  check_float(probs, op, "probs");
  require_cpu(probs, op);
  LT_CHECK(probs.ndim() == 2, op, ": probs must be [N, E], got ", probs.str());
  const int64_t N = probs.dim(0), E = probs.dim(1);
  check_like(lse, probs, op, "lse");
  check_shape(lse, {N}, op, "lse");
  check_ids(ids, N, op);
  const int64_t k = ids.dim(1);
  check_like(counts, probs, op, "counts");
  check_shape(counts, {E}, op, "counts");
  check_f64(balance, {1}, probs, op, "balance");
  check_f64(z, {1}, probs, op, "z");
  check_like(aux, probs, op, "aux");
  check_shape(aux, {1}, op, "aux");
  // Every count is at most N k: below the largest integer that the float dtype holds exactly, no count
  // rounds (f32: 2^24 assignments per routing).
  const int64_t exact = probs.dtype() == DType::F32 ? int64_t{1} << std::numeric_limits<float>::digits
                                                    : int64_t{1} << std::numeric_limits<double>::digits;
  LT_CHECK(N * k <= exact, op, ": ", N * k, " assignments exceed the exact integers of ", dtype_name(probs.dtype()));
  const int32_t* id = ids.data<int32_t>();
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    const T* p = probs.data<T>();
    const T* l = lse.data<T>();
    T* c = counts.data<T>();
    std::fill(c, c + E, T(0));
    for (int64_t a = 0; a < N * k; ++a) {
      LT_CHECK(id[a] >= 0 && id[a] < E, op, ": expert id ", id[a], " outside [0, ", E, ")");
      c[id[a]] += 1;
    }
    double balance_sum = 0, z_sum = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) balance_sum += static_cast<double>(p[n * E + e]) * static_cast<double>(c[e]);
    for (int64_t n = 0; n < N; ++n) z_sum += static_cast<double>(l[n]) * l[n];
    const double balance_factor = N > 0 ? static_cast<double>(E) / (static_cast<double>(N) * N * k) : 0.0;
    const double z_factor = N > 0 ? 1.0 / static_cast<double>(N) : 0.0;
    const double b = balance_sum * balance_factor, zl = z_sum * z_factor;
    balance.data<double>()[0] = b;
    z.data<double>()[0] = zl;
    aux.data<T>()[0] = static_cast<T>(balance_coef * b + z_coef * zl);
  });
}

// Per token, -sum_e p_e log p_e = lse - sum_e p_e s_e: one dot product per row instead of E logarithms.
void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit) {
  const char* op = "routing_entropy";
  check_float(probs, op, "probs");
  require_cpu(probs, op);
  LT_CHECK(probs.ndim() == 2, op, ": probs must be [N, E], got ", probs.str());
  const int64_t N = probs.dim(0), E = probs.dim(1);
  check_like(logits, probs, op, "logits");
  check_shape(logits, probs.shape(), op, "logits");
  check_like(lse, probs, op, "lse");
  check_shape(lse, {N}, op, "lse");
  check_f64(entropy, {1}, probs, op, "entropy");
  check_f64(max_logit, {1}, probs, op, "max_logit");
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    const T* p = probs.data<T>();
    const T* s = logits.data<T>();
    const T* l = lse.data<T>();
    double total = 0;
    for (int64_t n = 0; n < N; ++n) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(p[n * E + e]) * s[n * E + e];
      total += static_cast<double>(l[n]) - dot;
    }
    entropy.data<double>()[0] = N > 0 ? total / static_cast<double>(N) : 0;
    max_logit.data<double>()[0] = N * E > 0 ? static_cast<double>(*std::max_element(s, s + N * E)) : 0;
  });
}

void dispatch_plan(const Tensor& ids, Tensor& token_of, Tensor& position_of, Tensor& offsets) {
  const char* op = "dispatch_plan";
  LT_CHECK(ids.defined() && ids.dtype() == DType::I32 && ids.ndim() == 2, op, ": ids must be i32 [N, k], got ",
           ids.defined() ? ids.str() : "undefined");
  require_cpu(ids, op);
  const int64_t k = ids.dim(1), M = ids.numel();
  LT_CHECK(M <= std::numeric_limits<int32_t>::max(), op, ": ", M, " assignments do not fit i32 rows");
  LT_CHECK(offsets.defined() && offsets.dtype() == DType::I64 && offsets.ndim() == 1 && offsets.numel() >= 1 &&
               offsets.device() == ids.device(),
           op, ": offsets must be i64 [E + 1] on ", ids.device().str(), ", got ",
           offsets.defined() ? offsets.str() : "undefined");
  check_like(token_of, ids, op, "token_of");
  check_shape(token_of, {M}, op, "token_of");
  check_like(position_of, ids, op, "position_of");
  check_shape(position_of, {M}, op, "position_of");
  const int64_t E = offsets.numel() - 1;
  const int32_t* id = ids.data<int32_t>();
  int64_t* off = offsets.data<int64_t>();
  int32_t* token = token_of.data<int32_t>();
  int32_t* position = position_of.data<int32_t>();
  std::fill(off, off + E + 1, int64_t{0});
  for (int64_t a = 0; a < M; ++a) {
    LT_CHECK(id[a] >= 0 && id[a] < E, op, ": expert id ", id[a], " outside [0, ", E, ")");
    ++off[id[a] + 1];
  }
  for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
  // off[e] serves as expert e's write cursor; assignments go in (token, slot) order, so the sort is
  // stable. Each cursor ends at the next expert's start, so shifting by one restores the starts without
  // a scratch array.
  for (int64_t a = 0; a < M; ++a) {
    const int64_t pos = off[id[a]]++;
    position[a] = static_cast<int32_t>(pos);
    token[pos] = static_cast<int32_t>(a / k);
  }
  for (int64_t e = E; e > 0; --e) off[e] = off[e - 1];
  off[0] = 0;
}

// One dense GEMM per expert on its contiguous rows, so each expert's work is as efficient as its
// segment allows.
void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& offsets, Tensor& out, double beta) {
  const char* op = "grouped_matmul";
  check_float(a, op, "a");
  check_like(w, a, op, "w");
  check_like(out, a, op, "out");
  LT_CHECK(a.ndim() == 2 && w.ndim() == 3 && out.ndim() == 2 && out.dim(0) == a.dim(0) &&
               a.dim(1) == w.dim(trans_w ? 2 : 1) && out.dim(1) == w.dim(trans_w ? 1 : 2),
           op, ": a ", a.str(), ", w ", w.str(), (trans_w ? " (transposed)" : ""), " and out ", out.str(),
           " do not fit");
  const int64_t E = w.dim(0);
  const int64_t* off = segment_offsets(offsets, E, a.dim(0), op);
  const Shape slice{w.dim(1), w.dim(2)};
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = off[e + 1] - off[e];
    if (rows == 0) continue;
    Tensor out_e = out.narrow(off[e], rows);
    matmul(a.narrow(off[e], rows), false, w.narrow(e, 1).reshape(slice), trans_w, out_e, 1.0, beta);
  }
}

void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& offsets, Tensor& dw, double beta) {
  const char* op = "grouped_weight_grad";
  check_float(a, op, "a");
  check_like(b, a, op, "b");
  check_like(dw, a, op, "dw");
  LT_CHECK(a.ndim() == 2 && b.ndim() == 2 && dw.ndim() == 3 && b.dim(0) == a.dim(0) && dw.dim(1) == a.dim(1) &&
               dw.dim(2) == b.dim(1),
           op, ": a ", a.str(), ", b ", b.str(), " and dw ", dw.str(), " do not fit ([M, P], [M, Q], [E, P, Q])");
  LT_CHECK(beta == 0 || beta == 1, op, ": beta must be 0 or 1, got ", beta);
  const int64_t E = dw.dim(0);
  const int64_t* off = segment_offsets(offsets, E, a.dim(0), op);
  const Shape slice{dw.dim(1), dw.dim(2)};
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = off[e + 1] - off[e];
    Tensor dw_e = dw.narrow(e, 1).reshape(slice);
    if (rows > 0) matmul(a.narrow(off[e], rows), true, b.narrow(off[e], rows), false, dw_e, 1.0, beta);
    else if (beta == 0) dw_e.zero_();
  }
}

void accumulate_f64(const Tensor& x, Tensor& sum) {
  const char* op = "accumulate_f64";
  check_float(x, op, "x");
  require_cpu(x, op);
  LT_CHECK(sum.defined() && sum.dtype() == DType::F64 && sum.device() == x.device() && sum.numel() == x.numel(), op,
           ": sum must be f64 of ", x.numel(), " elements on ", x.device().str(), ", got ",
           sum.defined() ? sum.str() : "undefined");
  double* out = sum.data<double>();
  LT_FLOAT_SWITCH(x.dtype(), T, {
    const T* in = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) out[i] += static_cast<double>(in[i]);
  });
}

}  // namespace lt::kernels
