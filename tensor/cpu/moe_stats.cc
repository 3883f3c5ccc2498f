// The MoE statistics and dispatch kernels: the routing-warmup statistics and noise, the router's
// auxiliary-loss sums, the routing entropy, the dispatch's counting sort and the grouped GEMMs over its
// segments. The sums are plain f64 loops in element order on one thread (the order is what makes them
// deterministic and equal to the host loops they replaced); they touch N x E values once, next to the
// router's own passes over the same data.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/amx.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/grouped_gemm.h"
#include "tensor/moe_rows.h"
#include "tensor/threadpool.h"

namespace lt::cpu {

void routing_warmup_observe(const Tensor& logits, const Tensor& stats, Tensor& observations) {
  const int64_t n = logits.numel();
  const double shift = stats.data<double>()[0];
  double* obs = observations.data<double>();
  LT_FLOAT_SWITCH(logits.dtype(), T, {
    const T* s = logits.data<T>();
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(s[i]) - shift;
      sum += d;
      sum_sq += d * d;
    }
    obs[0] += static_cast<double>(n);
    obs[1] += sum;
    obs[2] += sum_sq;
  });
}

void routing_warmup_fold(Tensor& observations, double momentum, Tensor& stats) {
  double* obs = observations.data<double>();
  double* st = stats.data<double>();
  fold_warmup_observations(obs, momentum, st);
}

void routing_warmup_noise(const Tensor& stats, const Tensor& eps, double alpha, Tensor& noise) {
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
  const int64_t N = probs.dim(0), E = probs.dim(1), k = ids.dim(1);
  const int32_t* id = ids.data<int32_t>();
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    const T* p = probs.data<T>();
    const T* l = lse.data<T>();
    T* c = counts.data<T>();
    std::fill(c, c + E, T(0));
    for (int64_t a = 0; a < N * k; ++a) c[id[a]] += 1;
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

void router_topk_with_aux_loss(const Tensor& logits, int64_t k, bool renormalize, double balance_coef, double z_coef,
                               Tensor& probs, Tensor& lse, Tensor& weights, Tensor& ids, Tensor& counts,
                               Tensor& balance, Tensor& z, Tensor& aux) {
  router_topk(logits, k, renormalize, probs, lse, weights, ids);
  router_aux_loss(probs, lse, ids, balance_coef, z_coef, counts, balance, z, aux);
}

// Per token, -sum_e p_e log p_e = lse - sum_e p_e s_e: one dot product per row instead of E logarithms.
void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit) {
  const int64_t N = probs.dim(0), E = probs.dim(1);
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
  const int64_t k = ids.dim(1), M = ids.numel(), E = offsets.numel() - 1;
  const int32_t* id = ids.data<int32_t>();
  int64_t* off = offsets.data<int64_t>();
  int32_t* token = token_of.data<int32_t>();
  int32_t* position = position_of.data<int32_t>();
  std::fill(off, off + E + 1, int64_t{0});
  for (int64_t a = 0; a < M; ++a) ++off[id[a] + 1];
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

namespace {

// One item of a grouped product: rows [first, first + rows) of expert `expert`'s segment, for all of the
// products (product < 0) or for one.
struct ExpertItem {
  int64_t expert, first, rows, product;
};

// How for_each_expert cuts an expert's work into items.
struct ExpertSplit {
  // The products one after the other on the same rows, each reading what the one before wrote (dx =
  // dgate W_gate + dup W_up): the rows are cut into parts of kPartRows or more, each with all products.
  bool rows = false;
  // Independent products (the weight gradients, each into its own tensor): one item per product.
  int64_t products = 0;
  // The FLOPs of one row through all of the products: all of the experts' rows together below a pool
  // worker's worth (kMinFlopsPerPiece) run on the calling thread (one token's experts, when decoding).
  double row_flops = 0;
};

// 2 x the elements of each expert's part of `w` ([E, N, K] or [E, K, N]): the FLOPs of one row through it.
double row_flops_through(const Tensor& w) { return 2.0 * static_cast<double>(w.numel() / w.dim(0)); }

// Parts of at least this many rows (a few hundred microseconds of FMAs on moe-s's experts), at multiples
// of kPartAlign rows (the GEMM tile's 6 rows, so no part adds a partial row panel). Each part still takes
// the GEMM's panel path, where an element's FMA chain does not depend on which rows are computed
// together, so the parts give the whole segment's bits. A weight gradient's rows are its sum over k, so
// it is never cut.
constexpr int64_t kPartRows = 128;
constexpr int64_t kPartAlign = 6;

// Runs item(...) over every expert of `offsets` [E + 1] with one fork-join for the small experts rather
// than one per expert: an expert segment's GEMM (a few hundred rows) takes about as long as waking the
// other cores for it. An expert with more than a thread's share of the rows runs alone, its GEMMs
// splitting themselves over the threads. The others are the items of parallel_for_each: threads start
// on contiguous ranges of about equal rows and take over the last items of the others'. Taking over
// evened out a thread whose data sat in the other core's cache or whose vCPU lost time to the host (the
// time one thread waited for the other fell from 16.5 to 13.0 ms per moe-s step of 177 on Zen 4, 2
// threads), and items smaller than an expert shorten the last one a thread may be left waiting for (with
// parallel_for's pieces, the waits of a whole step fell to ~4 ms). An expert's items are adjacent, so they
// mostly run back to back on one thread, sharing its operands in L2. Each item writes only its own outputs,
// so which thread runs it never changes a result. All of the rows together less than two pool workers'
// worth of FLOPs (split.row_flops) run on the calling thread: a decoded token's few experts.
template <class Item>
void for_each_expert(const int64_t* offsets, int64_t E, ExpertSplit split, Item item) {
  const int64_t total_rows = offsets[E] - offsets[0];
  const bool small = static_cast<double>(total_rows) * split.row_flops < 2 * kMinFlopsPerPiece;
  const int64_t threads = small ? 1 : num_threads();
  std::vector<ExpertItem> items;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    if (threads > 1 && rows * threads > total_rows) {
      item(ExpertItem{e, offsets[e], rows, -1});
      continue;
    }
    if (split.products > 0) {
      for (int64_t product = 0; product < split.products; ++product) items.push_back({e, offsets[e], rows, product});
      continue;
    }
    const int64_t parts = split.rows && threads > 1 ? std::max<int64_t>(1, rows / kPartRows) : 1;
    const int64_t row_panels = (rows + kPartAlign - 1) / kPartAlign;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t begin = std::min(rows, chunk_begin(row_panels, parts, p) * kPartAlign);
      const int64_t end = p + 1 == parts ? rows : chunk_begin(row_panels, parts, p + 1) * kPartAlign;
      items.push_back({e, offsets[e] + begin, end - begin, -1});
    }
  }
  if (threads == 1) {
    for (const ExpertItem& it : items) item(it);
    return;
  }
  parallel_for_each(
      static_cast<int64_t>(items.size()), [&](int64_t i) { return items[static_cast<size_t>(i)].rows; },
      [&](int64_t i) { item(items[static_cast<size_t>(i)]); });
}

}  // namespace

// The weights of the experts whose rows for_each_expert cuts into several items (or whose GEMMs split
// over the threads), packed once per call into the bf16 GEMM's pair panels (pack_b_pairs) rather than
// once per item: each item of kPartRows rows would otherwise convert and pack its expert's whole weight,
// as much data as its rows. Packed in parallel over those experts; the GEMMs read the panels as they are
// (the same bits). On the AMX tiles only: there the products take a quarter of VDPBF16PS's time and
// converting and packing the operands as long as the products (docs/performance.md), while with
// VDPBF16PS a moe-m step's grouped products measured alike either way (Zen 5: forward 1.01x the time,
// backward 0.97x) and the packed weights added 6 MiB to its peak. Empty otherwise.
class PackedExpertWeights {
 public:
  PackedExpertWeights(const std::vector<GroupedProduct>& products, const int64_t* offsets, int64_t E,
                      MatmulPrecision precision) {
    if (precision != MatmulPrecision::BF16Inputs || !bf16_matmul_available() || amx_tiles() == AmxTiles::Off ||
        num_threads() == 1)
      return;
    const int64_t total_rows = offsets[E] - offsets[0];
    std::vector<int64_t> experts;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows >= 2 * kPartRows || rows * num_threads() > total_rows) experts.push_back(e);
    }
    if (experts.empty()) return;
    packed_.assign(products.size(), std::vector<Tensor>(static_cast<size_t>(E)));
    parallel_for(static_cast<int64_t>(experts.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        for (size_t p = 0; p < products.size(); ++p) {
          const int64_t e = experts[static_cast<size_t>(i)];
          const Tensor& w = products[p].w;
          packed_[p][static_cast<size_t>(e)] =
              pack_b_pairs(w.narrow(e, 1).reshape({w.dim(1), w.dim(2)}), products[p].trans_w);
        }
    });
  }
  // Product p's weight of expert e in pair panels; undefined where it is packed as it goes.
  const Tensor& of(size_t p, int64_t e) const {
    static const Tensor none;
    return packed_.empty() ? none : packed_[p][static_cast<size_t>(e)];
  }

 private:
  std::vector<std::vector<Tensor>> packed_;
};

// matmul_gathered as tensor/grouped_gemm.h calls it, with b read from b_pairs where that holds it packed
// (PackedExpertWeights), else packed as it goes.
auto matmul_reading(const Tensor& b_pairs) {
  return [b_pairs](const Tensor& a, const Tensor& a_rows, bool trans_a, const Tensor& b, const Tensor& b_rows,
                   bool trans_b, Tensor& c, double alpha, double beta, MatmulPrecision precision) {
    matmul_gathered(a, a_rows, trans_a, b, b_rows, trans_b, c, alpha, beta, precision, b_pairs);
  };
}

// An expert's products back to back: its segment of an operand they share is then in L2 for the second
// (the whole operand, a few MiB, is not). Against all experts' first products, then all their second
// ones, on Zen 4 with moe-s's experts and cold operands (gemm_bench --filter paired, 1 thread):
// 1.02-1.07x on AVX-512, 1.03-1.08x on AVX2.
void grouped_matmuls(const std::vector<GroupedProduct>& products, const Tensor& offsets, MatmulPrecision precision) {
  const int64_t* bounds = offsets.data<int64_t>();
  const int64_t E = offsets.numel() - 1;
  double row_flops = 0;
  for (const GroupedProduct& p : products) row_flops += row_flops_through(p.w);
  const PackedExpertWeights packed(products, bounds, E, precision);
  for_each_expert(bounds, E, ExpertSplit{.rows = true, .row_flops = row_flops}, [&](const ExpertItem& item) {
    for (size_t p = 0; p < products.size(); ++p) {
      grouped_matmul_rows(products[p], item.expert, item.first, item.rows, precision,
                          matmul_reading(packed.of(p, item.expert)));
    }
  });
}

void grouped_weight_grads(const std::vector<GroupedWeightGrad>& grads, const Tensor& offsets,
                          MatmulPrecision precision) {
  const int64_t* bounds = offsets.data<int64_t>();
  const auto products = static_cast<int64_t>(grads.size());
  double row_flops = 0;
  for (const GroupedWeightGrad& g : grads) row_flops += row_flops_through(g.dw);
  for_each_expert(bounds, offsets.numel() - 1, ExpertSplit{.products = products, .row_flops = row_flops},
                  [&](const ExpertItem& item) {
    for (int64_t i = 0; i < products; ++i) {
      if (item.product >= 0 && item.product != i) continue;
      grouped_weight_grad_segment(grads[static_cast<size_t>(i)], bounds, item.expert, precision,
                                  matmul_reading(Tensor()));
    }
  });
}

void accumulate_f64(const Tensor& x, Tensor& sum) {
  double* out = sum.data<double>();
  LT_FLOAT_SWITCH(x.dtype(), T, {
    const T* in = x.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) out[i] += static_cast<double>(in[i]);
  });
}

}  // namespace lt::cpu
