// The MoE statistics and dispatch kernels against plain scalar loops. Where the kernel promises the
// host loop's summation order (the warmup statistics, the auxiliary-loss sums, the entropy, the
// counting sort) the results must be equal bit for bit; the grouped GEMMs go through the tiled matmul
// and are compared with a tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <tuple>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"
#include "tests/test_util.h"

namespace lt {
namespace {

using test::expect_close;
using test::random_tensor;

// Router outputs for random logits [N, E] of the given dtype: the inputs of the statistics kernels.
struct RoutingTensors {
  Tensor logits, probs, lse, weights, ids;
};
RoutingTensors routing(DType dtype, int64_t N, int64_t E, int64_t k, uint64_t seed) {
  RoutingTensors r;
  r.logits = random_tensor({N, E}, seed, dtype, 2.0);
  r.probs = Tensor::empty({N, E}, dtype);
  r.lse = Tensor::empty({N}, dtype);
  r.weights = Tensor::empty({N, k}, dtype);
  r.ids = Tensor::empty({N, k}, DType::I32);
  kernels::router_topk(r.logits, k, true, r.probs, r.lse, r.weights, r.ids);
  return r;
}

template <class T>
std::vector<double> as_double(const Tensor& t) {
  const std::vector<T> v = t.to_vector<T>();
  return std::vector<double>(v.begin(), v.end());
}

// The warmup statistics' update as a host loop: one step over the logits of all its forwards, two passes
// (mean, then squared deviations).
template <class T>
void step_reference(const std::vector<T>& s, double momentum, double stats[3]) {
  const int64_t n = static_cast<int64_t>(s.size());
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += s[i];
  const double mean = sum / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) sum_sq += (s[i] - mean) * (s[i] - mean);
  const double deviation = std::sqrt(sum_sq / static_cast<double>(n));
  if (stats[2] == 0) {
    stats[0] = mean;
    stats[1] = deviation;
    stats[2] = 1;
    return;
  }
  stats[0] = momentum * stats[0] + (1 - momentum) * mean;
  stats[1] = momentum * stats[1] + (1 - momentum) * deviation;
}

// Steps of two forwards each, observed then folded: the statistics of all the step's logits (the host's
// two passes, to the rounding of the shifted sums), the observations zeroed; the same step observed as
// one forward folds to the same figures; no observation leaves the statistics as they are.
template <class T>
void check_warmup_observe_and_fold(DType dtype) {
  Tensor stats = Tensor::from_vector<double>({3}, {0.0, 1.0, 0.0});
  Tensor observations = Tensor::zeros({3}, DType::F64);
  double want[3] = {0.0, 1.0, 0.0};
  for (uint64_t step = 0; step < 3; ++step) {
    const Tensor first = random_tensor({37, 9}, 50 + step, dtype, 1.5 + static_cast<double>(step));
    const Tensor second = random_tensor({20, 9}, 60 + step, dtype, 2.0);
    Tensor one_stats = stats.clone(), one_observations = Tensor::zeros({3}, DType::F64);
    kernels::routing_warmup_observe(first, stats, observations);
    kernels::routing_warmup_observe(second, stats, observations);
    kernels::routing_warmup_observe(Tensor::empty({0, 9}, dtype), stats, observations);
    kernels::routing_warmup_fold(observations, 0.99, stats);
    std::vector<T> all = first.to_vector<T>();
    const std::vector<T> more = second.to_vector<T>();
    all.insert(all.end(), more.begin(), more.end());
    step_reference(all, 0.99, want);
    const std::vector<double> got = stats.to_vector<double>();
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(got[i], want[i], 1e-12 * std::abs(want[i])) << "step " << step;
    EXPECT_EQ(observations.to_vector<double>(), std::vector<double>(3, 0.0)) << "step " << step;
    const Tensor whole = Tensor::from_vector<T>({static_cast<int64_t>(all.size())}, all);
    kernels::routing_warmup_observe(whole, one_stats, one_observations);
    kernels::routing_warmup_fold(one_observations, 0.99, one_stats);
    const std::vector<double> one = one_stats.to_vector<double>();
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(one[i], got[i], 1e-14 * std::abs(got[i])) << "step " << step;
  }
  const std::vector<double> before = stats.to_vector<double>();
  kernels::routing_warmup_fold(observations, 0.99, stats);
  EXPECT_EQ(stats.to_vector<double>(), before) << "nothing observed";
  EXPECT_THROW(kernels::routing_warmup_observe(random_tensor({2, 3}, 1, dtype), stats, stats), Error);
}

TEST(MoEStats, WarmupStatisticsFoldEachStepsObservations) {
  check_warmup_observe_and_fold<float>(DType::F32);
  check_warmup_observe_and_fold<double>(DType::F64);
}

template <class T>
void check_warmup_noise(DType dtype) {
  const Tensor stats = Tensor::from_vector<double>({3}, {0.3, 1.7, 1.0});
  const Tensor eps = random_tensor({23, 7}, 61, DType::F64);
  const double alpha = 0.35;
  Tensor noise = Tensor::empty({23, 7}, dtype);
  kernels::routing_warmup_noise(stats, eps, alpha, noise);
  const std::vector<double> e = eps.to_vector<double>();
  std::vector<T> want(e.size());
  for (size_t i = 0; i < e.size(); ++i) want[i] = static_cast<T>((1 - alpha) * (0.3 + 1.7 * e[i]));
  EXPECT_EQ(noise.to_vector<T>(), want);
}

TEST(MoEStats, WarmupNoiseIsTheHostLoop) {
  check_warmup_noise<float>(DType::F32);
  check_warmup_noise<double>(DType::F64);
}

template <class T>
void check_router_aux_loss(DType dtype, int64_t N, int64_t E, int64_t k) {
  SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " N=" << N << " E=" << E << " k=" << k);
  const RoutingTensors r = routing(dtype, N, E, k, 71);
  Tensor counts = Tensor::empty({E}, dtype), aux = Tensor::empty({1}, dtype);
  Tensor balance = Tensor::empty({1}, DType::F64), z = Tensor::empty({1}, DType::F64);
  kernels::router_aux_loss(r.probs, r.lse, r.ids, 0.015, 1e-4, counts, balance, z, aux);

  const std::vector<int32_t> ids = r.ids.to_vector<int32_t>();
  const std::vector<T> p = r.probs.to_vector<T>(), l = r.lse.to_vector<T>();
  std::vector<int64_t> want_counts(static_cast<size_t>(E), 0);
  for (int32_t id : ids) ++want_counts[static_cast<size_t>(id)];
  double want_balance = 0, want_z = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) want_balance += static_cast<double>(p[n * E + e]) * want_counts[e];
  for (int64_t n = 0; n < N; ++n) want_z += static_cast<double>(l[n]) * l[n];
  want_balance *= static_cast<double>(E) / (static_cast<double>(N) * N * k);
  want_z *= 1.0 / static_cast<double>(N);

  EXPECT_EQ(as_double<T>(counts), std::vector<double>(want_counts.begin(), want_counts.end()));
  EXPECT_EQ(balance.item(), want_balance);
  EXPECT_EQ(z.item(), want_z);
  EXPECT_EQ(aux.to_vector<T>()[0], static_cast<T>(0.015 * want_balance + 1e-4 * want_z));
}

TEST(MoEStats, RouterAuxLossIsTheHostLoop) {
  for (const auto& [N, E, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{37, 8, 3}, {129, 64, 6}, {5, 3, 1}}) {
    check_router_aux_loss<float>(DType::F32, N, E, k);
    check_router_aux_loss<double>(DType::F64, N, E, k);
  }
}

TEST(MoEStats, RouterAuxLossRejectsAnIdOutsideTheExperts) {
  const RoutingTensors r = routing(DType::F32, 4, 5, 2, 72);
  Tensor bad = Tensor::from_vector<int32_t>({4, 2}, {0, 1, 2, 3, 4, 5, 0, 1});
  Tensor counts = Tensor::empty({5}), aux = Tensor::empty({1});
  Tensor balance = Tensor::empty({1}, DType::F64), z = Tensor::empty({1}, DType::F64);
  EXPECT_THROW(kernels::router_aux_loss(r.probs, r.lse, bad, 1, 1, counts, balance, z, aux), Error);
}

template <class T>
void check_routing_entropy(DType dtype) {
  const int64_t N = 41, E = 16;
  const RoutingTensors r = routing(dtype, N, E, 2, 81);
  Tensor entropy = Tensor::empty({1}, DType::F64), max_logit = Tensor::empty({1}, DType::F64);
  kernels::routing_entropy(r.probs, r.logits, r.lse, entropy, max_logit);
  const std::vector<T> p = r.probs.to_vector<T>(), s = r.logits.to_vector<T>(), l = r.lse.to_vector<T>();
  double total = 0;
  for (int64_t n = 0; n < N; ++n) {
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(p[n * E + e]) * s[n * E + e];
    total += static_cast<double>(l[n]) - dot;
  }
  EXPECT_EQ(entropy.item(), total / static_cast<double>(N));
  EXPECT_EQ(max_logit.item(), static_cast<double>(*std::max_element(s.begin(), s.end())));
  // And it is the entropy: -sum p log p, to rounding.
  double direct = 0;
  for (int64_t i = 0; i < N * E; ++i) direct -= static_cast<double>(p[i]) * std::log(static_cast<double>(p[i]));
  EXPECT_NEAR(entropy.item(), direct / static_cast<double>(N), dtype == DType::F32 ? 1e-5 : 1e-12);
}

TEST(MoEStats, RoutingEntropyIsTheHostLoop) {
  check_routing_entropy<float>(DType::F32);
  check_routing_entropy<double>(DType::F64);
}

TEST(MoEStats, DispatchPlanIsAStableSortByExpert) {
  const int64_t N = 29, k = 3, E = 7;
  std::vector<int32_t> ids;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) ids.push_back(static_cast<int32_t>((n * 5 + j * 2) % (E - 1)));  // expert 6 idle
  Tensor token_of = Tensor::empty({N * k}, DType::I32), position_of = Tensor::empty({N * k}, DType::I32);
  Tensor offsets = Tensor::empty({E + 1}, DType::I64);
  kernels::dispatch_plan(Tensor::from_vector<int32_t>({N, k}, ids), token_of, position_of, offsets);

  std::vector<int64_t> order(static_cast<size_t>(N * k));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int32_t> want_token(order.size()), want_position(order.size());
  std::vector<int64_t> want_offsets(static_cast<size_t>(E + 1), 0);
  for (size_t m = 0; m < order.size(); ++m) {
    want_token[m] = static_cast<int32_t>(order[m] / k);
    want_position[static_cast<size_t>(order[m])] = static_cast<int32_t>(m);
  }
  for (int32_t id : ids) ++want_offsets[static_cast<size_t>(id) + 1];
  std::partial_sum(want_offsets.begin(), want_offsets.end(), want_offsets.begin());
  EXPECT_EQ(token_of.to_vector<int32_t>(), want_token);
  EXPECT_EQ(position_of.to_vector<int32_t>(), want_position);
  EXPECT_EQ(offsets.to_vector<int64_t>(), want_offsets);

  ids[4] = static_cast<int32_t>(E);
  EXPECT_THROW(kernels::dispatch_plan(Tensor::from_vector<int32_t>({N, k}, ids), token_of, position_of, offsets),
               Error);
}

// Segments of 0, 5, 1, 0 and 9 rows over 5 experts.
Tensor segment_offsets() { return Tensor::from_vector<int64_t>({6}, {0, 0, 5, 6, 6, 15}); }

TEST(MoEStats, GroupedMatmulIsOneMatmulPerSegment) {
  const Tensor offsets = segment_offsets();
  const std::vector<int64_t> off = offsets.to_vector<int64_t>();
  const int64_t M = 15, K = 6, N = 4, E = 5;
  const Tensor a = random_tensor({M, K}, 91, DType::F64);
  for (bool trans_w : {true, false}) {
    SCOPED_TRACE(trans_w ? "w transposed" : "w plain");
    const Tensor w = random_tensor(trans_w ? Shape{E, N, K} : Shape{E, K, N}, 92, DType::F64);
    const Tensor init = random_tensor({M, N}, 93, DType::F64);
    const std::vector<double> av = a.to_vector<double>(), wv = w.to_vector<double>(), iv = init.to_vector<double>();
    for (double beta : {0.0, 1.0}) {
      Tensor out = init.clone();
      kernels::grouped_matmul(a, w, trans_w, offsets, out, beta);
      std::vector<double> want(static_cast<size_t>(M * N));
      for (int64_t e = 0; e < E; ++e)
        for (int64_t m = off[e]; m < off[e + 1]; ++m)
          for (int64_t j = 0; j < N; ++j) {
            double dot = 0;
            for (int64_t i = 0; i < K; ++i)
              dot += av[m * K + i] * (trans_w ? wv[(e * N + j) * K + i] : wv[(e * K + i) * N + j]);
            want[m * N + j] = dot + beta * iv[m * N + j];
          }
      expect_close(out.to_vector<double>(), want, 1e-12, 1e-12, beta == 0 ? "beta 0" : "beta 1");
    }
  }
}

TEST(MoEStats, GroupedWeightGradIsOneMatmulPerSegment) {
  const Tensor offsets = segment_offsets();
  const std::vector<int64_t> off = offsets.to_vector<int64_t>();
  const int64_t M = 15, P = 3, Q = 4, E = 5;
  const Tensor a = random_tensor({M, P}, 101, DType::F64), b = random_tensor({M, Q}, 102, DType::F64);
  const Tensor init = random_tensor({E, P, Q}, 103, DType::F64);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), iv = init.to_vector<double>();
  for (double beta : {0.0, 1.0}) {
    Tensor dw = init.clone();
    kernels::grouped_weight_grad(a, b, offsets, dw, beta);
    std::vector<double> want(static_cast<size_t>(E * P * Q));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < P; ++i)
        for (int64_t j = 0; j < Q; ++j) {
          double dot = 0;
          for (int64_t m = off[e]; m < off[e + 1]; ++m) dot += av[m * P + i] * bv[m * Q + j];
          want[(e * P + i) * Q + j] = dot + beta * iv[(e * P + i) * Q + j];
        }
    expect_close(dw.to_vector<double>(), want, 1e-12, 1e-12, beta == 0 ? "beta 0" : "beta 1");
  }
}

// Experts of uneven rows: empty ones, one larger than a thread's share (300 of 541), one small.
Tensor uneven_offsets() {
  const std::vector<int64_t> rows = {40, 0, 300, 7, 0, 64, 129, 1};
  std::vector<int64_t> bounds = {0};
  for (int64_t r : rows) bounds.push_back(bounds.back() + r);
  return Tensor::from_vector<int64_t>({static_cast<int64_t>(bounds.size())}, bounds);
}

// Runs `products` on 1, 2 and 3 threads and expects each of its results (named by `names`) to keep the
// bits of the 1-thread run.
void expect_the_same_bits_on_any_thread_count(const std::vector<const char*>& names,
                                              const std::function<std::vector<std::vector<float>>()>& products) {
  const int threads_before = num_threads();
  std::vector<std::vector<std::vector<float>>> runs;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    runs.push_back(products());
  }
  set_num_threads(threads_before);
  for (size_t t = 1; t < runs.size(); ++t)
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_EQ(runs[t][i], runs[0][i]) << names[i] << ", thread count " << t + 1;
}

// The CPU runs the small experts' GEMMs one group per thread and splits a large expert's GEMM over the
// threads; neither may change a bit.
TEST(MoEStats, GroupedGemmsGiveTheSameBitsOnAnyThreadCount) {
  const Tensor offsets = uneven_offsets();
  const int64_t E = offsets.numel() - 1, M = offsets.to_vector<int64_t>().back(), K = 48, N = 40;
  const Tensor a = random_tensor({M, K}, 111), w = random_tensor({E, N, K}, 112), g = random_tensor({M, N}, 113);
  expect_the_same_bits_on_any_thread_count({"grouped_matmul", "grouped_weight_grad"}, [&] {
    Tensor out = Tensor::zeros({M, N}), dw = Tensor::zeros({E, N, K});
    kernels::grouped_matmul(a, w, true, offsets, out);
    kernels::grouped_weight_grad(g, a, offsets, dw, 0.0);
    return std::vector<std::vector<float>>{out.to_vector<float>(), dw.to_vector<float>()};
  });
}

// The same in bf16 on each tile unit, where on the AMX tiles the weights of the experts cut into parts
// (the one of 300 rows) or running alone are packed once per call (tensor/cpu/moe_stats.cc,
// PackedExpertWeights; on 1 thread they are packed as they go): the bits of packing per GEMM, w read
// transposed (the forward) and as it is (dx).
TEST(MoEStats, Bf16GroupedGemmsGiveTheSameBitsOnAnyThreadCount) {
  if (!cpu::bf16_matmul_available()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const Tensor offsets = uneven_offsets();
  const int64_t E = offsets.numel() - 1, M = offsets.to_vector<int64_t>().back(), K = 80, N = 72;
  const Tensor a = random_tensor({M, K}, 114), w = random_tensor({E, N, K}, 115), g = random_tensor({M, N}, 116);
  const test::MatmulPrecisionScope precision(kernels::MatmulPrecision::BF16Inputs);
  test::for_each_bf16_tile_unit([&](const char* unit) {
    SCOPED_TRACE(unit);
    expect_the_same_bits_on_any_thread_count({"x w^T", "g w"}, [&] {
      Tensor out = Tensor::zeros({M, N}), dx = Tensor::zeros({M, K});
      kernels::grouped_matmul(a, w, true, offsets, out);
      kernels::grouped_matmul(g, w, false, offsets, dx);
      return std::vector<std::vector<float>>{out.to_vector<float>(), dx.to_vector<float>()};
    });
  });
}

// Paired products run expert by expert, each product's GEMM unchanged: the same bits as one grouped call
// per product in list order, a later product adding to an earlier one's out included (the experts' dx),
// on 1, 2 and 3 threads. One expert is larger than a thread's share and runs alone; the one of 300 rows
// is cut into parts of rows (2 and 3 threads), and the weight gradients into one item per product.
TEST(MoEStats, PairedGroupedProductsGiveTheBitsOfSeparateCalls) {
  const std::vector<int64_t> rows = {40, 0, 300, 7, 64, 520, 3};
  std::vector<int64_t> bounds = {0};
  for (int64_t r : rows) bounds.push_back(bounds.back() + r);
  const int64_t E = static_cast<int64_t>(rows.size()), M = bounds.back(), H = 48, I = 40;
  const Tensor offsets = Tensor::from_vector<int64_t>({E + 1}, bounds);
  const Tensor x = random_tensor({M, H}, 131), w_gate = random_tensor({E, I, H}, 132),
               w_up = random_tensor({E, I, H}, 133);
  const Tensor d_gate = random_tensor({M, I}, 134), d_up = random_tensor({M, I}, 135);
  const int threads_before = num_threads();
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    set_num_threads(threads);
    Tensor gate = Tensor::zeros({M, I}), up = Tensor::zeros({M, I}), dx = Tensor::zeros({M, H});
    Tensor dw_gate = Tensor::zeros({E, I, H}), dw_up = random_tensor({E, I, H}, 136);
    Tensor gate_1 = gate.clone(), up_1 = up.clone(), dx_1 = dx.clone(), dw_gate_1 = dw_gate.clone(),
           dw_up_1 = dw_up.clone();
    kernels::grouped_matmuls({{x, w_gate, true, gate, 0.0}, {x, w_up, true, up, 0.0}}, offsets);
    kernels::grouped_matmuls({{d_gate, w_gate, false, dx, 0.0}, {d_up, w_up, false, dx, 1.0}}, offsets);
    kernels::grouped_weight_grads({{d_gate, x, dw_gate, 0.0}, {d_up, x, dw_up, 1.0}}, offsets);
    kernels::grouped_matmul(x, w_gate, true, offsets, gate_1);
    kernels::grouped_matmul(x, w_up, true, offsets, up_1);
    kernels::grouped_matmul(d_gate, w_gate, false, offsets, dx_1);
    kernels::grouped_matmul(d_up, w_up, false, offsets, dx_1, 1.0);
    kernels::grouped_weight_grad(d_gate, x, offsets, dw_gate_1, 0.0);
    kernels::grouped_weight_grad(d_up, x, offsets, dw_up_1, 1.0);
    EXPECT_EQ(gate.to_vector<float>(), gate_1.to_vector<float>());
    EXPECT_EQ(up.to_vector<float>(), up_1.to_vector<float>());
    EXPECT_EQ(dx.to_vector<float>(), dx_1.to_vector<float>());
    EXPECT_EQ(dw_gate.to_vector<float>(), dw_gate_1.to_vector<float>());
    EXPECT_EQ(dw_up.to_vector<float>(), dw_up_1.to_vector<float>());
    // Both ways run through the same cutting into items, so each expert's whole segment is also computed
    // on its own, with the dense matmul: the items must give its bits.
    Tensor gate_2 = Tensor::zeros({M, I}), dx_2 = Tensor::zeros({M, H}), dw_up_2 = random_tensor({E, I, H}, 136);
    for (int64_t e = 0; e < E; ++e) {
      const int64_t first = bounds[static_cast<size_t>(e)], segment = rows[static_cast<size_t>(e)];
      if (segment == 0) continue;
      const auto expert = [e](const Tensor& w) { return w.narrow(e, 1).reshape({w.dim(1), w.dim(2)}); };
      Tensor gate_e = gate_2.narrow(first, segment), dx_e = dx_2.narrow(first, segment), dw_up_e = expert(dw_up_2);
      kernels::matmul(x.narrow(first, segment), false, expert(w_gate), true, gate_e);
      kernels::matmul(d_gate.narrow(first, segment), false, expert(w_gate), false, dx_e);
      kernels::matmul(d_up.narrow(first, segment), false, expert(w_up), false, dx_e, 1.0, 1.0);
      kernels::matmul(d_up.narrow(first, segment), true, x.narrow(first, segment), false, dw_up_e, 1.0, 1.0);
    }
    EXPECT_EQ(gate.to_vector<float>(), gate_2.to_vector<float>());
    EXPECT_EQ(dx.to_vector<float>(), dx_2.to_vector<float>());
    EXPECT_EQ(dw_up.to_vector<float>(), dw_up_2.to_vector<float>());
  }
  set_num_threads(threads_before);
}

// The experts read the tokens' rows through the dispatch (a_rows, b_rows: token_of) rather than a copy in
// expert order: the forward's x W^T, the backward's g W and the weight gradients g^T (w h) and dgate^T x
// have the bits of the same products on gathered copies, on 1 and 2 threads.
TEST(MoEStats, GroupedProductsReadGatheredRowsAsTheirCopy) {
  const std::vector<int64_t> rows = {40, 0, 300, 7, 64, 3};
  std::vector<int64_t> bounds = {0};
  for (int64_t r : rows) bounds.push_back(bounds.back() + r);
  const int64_t E = static_cast<int64_t>(rows.size()), M = bounds.back(), N = 150, H = 48, I = 40;
  std::vector<int32_t> token_of(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) token_of[static_cast<size_t>(m)] = static_cast<int32_t>((m * 37 + m / 5) % N);
  const Tensor rows_of = Tensor::from_vector<int32_t>({M}, token_of);
  const Tensor offsets = Tensor::from_vector<int64_t>({E + 1}, bounds);
  const Tensor x = random_tensor({N, H}, 151), g = random_tensor({N, H}, 152), w_gate = random_tensor({E, I, H}, 153),
               w_down = random_tensor({E, H, I}, 154), wh = random_tensor({M, I}, 155),
               d_gate = random_tensor({M, I}, 156);
  Tensor x_M = Tensor::empty({M, H}), g_M = Tensor::empty({M, H});
  kernels::gather_rows(x, rows_of, x_M);
  kernels::gather_rows(g, rows_of, g_M);
  const int threads_before = num_threads();
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    set_num_threads(threads);
    Tensor gate = Tensor::empty({M, I}), gate_copy = Tensor::empty({M, I});
    Tensor dgate = Tensor::empty({M, I}), dgate_copy = Tensor::empty({M, I});
    kernels::grouped_matmuls({{x, w_gate, true, gate, 0.0, rows_of}, {g, w_down, false, dgate, 0.0, rows_of}}, offsets);
    kernels::grouped_matmuls({{x_M, w_gate, true, gate_copy, 0.0}, {g_M, w_down, false, dgate_copy, 0.0}}, offsets);
    EXPECT_EQ(gate.to_vector<float>(), gate_copy.to_vector<float>());
    EXPECT_EQ(dgate.to_vector<float>(), dgate_copy.to_vector<float>());
    Tensor dw_down = random_tensor({E, H, I}, 157), dw_gate = Tensor::empty({E, I, H});
    Tensor dw_down_copy = dw_down.clone(), dw_gate_copy = Tensor::empty({E, I, H});
    kernels::grouped_weight_grads({{g, wh, dw_down, 1.0, rows_of}, {d_gate, x, dw_gate, 0.0, {}, rows_of}}, offsets);
    kernels::grouped_weight_grads({{g_M, wh, dw_down_copy, 1.0}, {d_gate, x_M, dw_gate_copy, 0.0}}, offsets);
    EXPECT_EQ(dw_down.to_vector<float>(), dw_down_copy.to_vector<float>());
    EXPECT_EQ(dw_gate.to_vector<float>(), dw_gate_copy.to_vector<float>());
  }
  set_num_threads(threads_before);

  // A row index outside the source, of the wrong type or length is one clear error, before any work.
  Tensor gate = Tensor::zeros({M, I});
  std::vector<int32_t> bad = token_of;
  bad[5] = static_cast<int32_t>(N);
  EXPECT_THROW(
      kernels::grouped_matmuls({{x, w_gate, true, gate, 0.0, Tensor::from_vector<int32_t>({M}, bad)}}, offsets), Error);
  EXPECT_THROW(kernels::grouped_matmuls({{x, w_gate, true, gate, 0.0, rows_of.to(DType::I64)}}, offsets), Error);
  EXPECT_THROW(kernels::grouped_matmuls({{x, w_gate, true, gate, 0.0, rows_of.narrow(0, M - 1)}}, offsets), Error);
  Tensor dw_gate = Tensor::zeros({E, I, H});
  EXPECT_THROW(kernels::grouped_weight_grads({{d_gate, x, dw_gate, 0.0, {}, rows_of.narrow(0, M - 1)}}, offsets),
               Error);
  EXPECT_EQ(gate.to_vector<float>(), std::vector<float>(static_cast<size_t>(M * I), 0.0f));
}

TEST(MoEStats, PairedGroupedProductsMustShareTheSegments) {
  const Tensor offsets = segment_offsets();
  const Tensor a = random_tensor({15, 6}, 141), w = random_tensor({5, 4, 6}, 142);
  const Tensor a_short = random_tensor({14, 6}, 143), a_f64 = random_tensor({15, 6}, 144, DType::F64);
  Tensor out = Tensor::empty({15, 4}), out_short = Tensor::empty({14, 4}), out_f64 = Tensor::empty({15, 4}, DType::F64);
  const Tensor w_f64 = random_tensor({5, 4, 6}, 145, DType::F64);
  EXPECT_THROW(kernels::grouped_matmuls({{a, w, true, out, 0.0}, {a_short, w, true, out_short, 0.0}}, offsets), Error);
  EXPECT_THROW(kernels::grouped_matmuls({{a, w, true, out, 0.0}, {a_f64, w_f64, true, out_f64, 0.0}}, offsets), Error);
  EXPECT_THROW(kernels::grouped_matmuls({}, offsets), Error);
}

TEST(MoEStats, GroupedMatmulRejectsOffsetsThatDoNotCoverTheRows) {
  const Tensor a = random_tensor({15, 6}, 111, DType::F64), w = random_tensor({5, 4, 6}, 112, DType::F64);
  Tensor out = Tensor::empty({15, 4}, DType::F64);
  EXPECT_THROW(kernels::grouped_matmul(a, w, true, Tensor::from_vector<int64_t>({6}, {0, 0, 5, 6, 6, 14}), out), Error);
  EXPECT_THROW(kernels::grouped_matmul(a, w, true, Tensor::from_vector<int64_t>({6}, {0, 7, 5, 6, 6, 15}), out), Error);
}

TEST(MoEStats, AccumulateF64AddsInDouble) {
  const Tensor x = random_tensor({9}, 121, DType::F32);
  Tensor sum = random_tensor({9}, 122, DType::F64);
  const std::vector<double> before = sum.to_vector<double>();
  kernels::accumulate_f64(x, sum);
  const std::vector<float> xv = x.to_vector<float>();
  std::vector<double> want(before);
  for (size_t i = 0; i < want.size(); ++i) want[i] += static_cast<double>(xv[i]);
  EXPECT_EQ(sum.to_vector<double>(), want);
}

}  // namespace
}  // namespace lt
