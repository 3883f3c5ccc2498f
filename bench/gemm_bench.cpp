// gemm_bench: f32 kernels::matmul on square and model-shaped matrices, on 1 and 2 threads, against the
// machine's measured FMA peak and, when built with OpenBLAS (LINGTRAIN_BENCH_OPENBLAS), against
// OpenBLAS sgemm on the same operands in the same process. With --dtype bf16 (CPUs with AVX512_BF16)
// our matmuls take bf16 inputs and are measured against the bf16 dot-product peak; OpenBLAS stays f32.
// In f32, each thread count ends with the routed experts' gate and up projections, two weights paired in
// one call (kernels::grouped_matmuls) against one fused weight, on operands out of cache (--filter
// gate_up: only those).
//
// The machines are shared and noisy, so the two libraries run alternately, round after round, and each
// figure is the median over rounds; a round times a batch of calls long enough (~20 ms) to dwarf the
// clock. Usage: gemm_bench [--rounds R] [--threads 1,2] [--filter TEXT] (only shapes whose label
// contains TEXT) [--dtype f32|bf16].
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "bench/fma_peak.h"
#include "tensor/kernels.h"
#include "tensor/random.h"
#include "tensor/threadpool.h"

#ifdef LINGTRAIN_BENCH_OPENBLAS
#include <cblas.h>
#endif

namespace lt {
namespace {

using Clock = std::chrono::steady_clock;

// c [M, N] = op(a) op(b). The model shapes are the GEMMs of a training step: a Linear forward x W^T
// (weights stored [out, in]), its input gradient g W and weight gradient g^T x, at 8192 tokens and
// the bench configs' widths, one decoding step's lm_head, the routed experts' small segments (few
// rows, K = 256, N = 128), and the router's logits (few columns: moe-s's 16 experts, moe-m's 32).
struct Shape3 {
  std::string label;
  int64_t M, N, K;
  bool trans_a, trans_b;
};

std::vector<Shape3> bench_shapes() {
  std::vector<Shape3> shapes;
  for (int64_t n : {256, 512, 1024, 2048})
    for (auto [ta, tb, name] : {std::tuple{false, false, "NN"}, {false, true, "NT"}, {true, false, "TN"}})
      shapes.push_back({"square " + std::to_string(n) + " " + name, n, n, n, ta, tb});
  const std::vector<Shape3> model = {
      {"x W^T      [8192x256]  W [1024x256]", 8192, 1024, 256, false, true},
      {"dx = g W   [8192x1024] W [1024x256]", 8192, 256, 1024, false, false},
      {"dW = g^T x [8192x1024] x [8192x256]", 1024, 256, 8192, true, false},
      {"a^T b      [1024x256]  b [1024x4096]", 256, 4096, 1024, true, false},
      {"x W^T      [1024x256]  W [4096x256]", 1024, 4096, 256, false, true},
      {"dx = g W   [1024x4096] W [4096x256]", 1024, 256, 4096, false, false},
      {"x W^T      [2048x512]  W [1536x512]", 2048, 1536, 512, false, true},
      // The NormHead loss's chunk of 256 rows (nn/normhead.cpp) against moe-s's head.
      {"head chunk x W^T    [256x256]  W [4096x256]", 256, 4096, 256, false, true},
      {"head chunk dh = g W [256x4096] W [4096x256]", 256, 256, 4096, false, false},
      {"head chunk dW = g^T x [256x4096] x [256x256]", 4096, 256, 256, true, false},
      {"decode x W^T [1x256]  W [4096x256]", 1, 4096, 256, false, true},
      {"expert x W^T  M=1", 1, 128, 256, false, true},
      {"expert x W^T  M=16", 16, 128, 256, false, true},
      {"expert x W^T  M=64", 64, 128, 256, false, true},
      {"expert x W^T  M=256", 256, 128, 256, false, true},
      {"expert dx=g W M=64", 64, 256, 128, false, false},
      {"expert dW=g^T x M=64", 128, 256, 64, true, false},
      {"router x W^T [1024x256] W [16x256]", 1024, 16, 256, false, true},
      {"router x W^T [2048x512] W [32x512]", 2048, 32, 512, false, true},
  };
  shapes.insert(shapes.end(), model.begin(), model.end());
  return shapes;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Before a round is timed, its library runs untimed for a while: long enough for the other library's
// threads to stop spinning. OpenBLAS's threads spin after each call before they sleep (libgomp's default
// wait policy where OpenBLAS is built with OpenMP, as Debian's libopenblas0-openmp is; OpenBLAS's own
// thread server otherwise), on the cores the next call needs: libgomp spins ~300,000 pauses, some
// 10-15 ms on the Xeon (2 vCPUs), where our 2-thread figures right after OpenBLAS's were 58-70% of the
// peak against 68-75% with OpenBLAS's threads made to sleep at once (OMP_WAIT_POLICY=passive, which in
// turn slowed OpenBLAS's own small shapes). Sleeping through the spin instead let the idle vCPUs halt,
// and the figures after it scattered from 18 to 72%.
void settle(const std::function<void()>& call) {
#ifdef LINGTRAIN_BENCH_OPENBLAS
  const Clock::time_point start = Clock::now();
  while (seconds_since(start) < 0.025) call();
#else
  (void)call;
#endif
}

// Calls per round so that a round lasts about `target_seconds`, from one timed call after a warm-up.
int64_t calls_per_round(const std::function<void()>& call, double target_seconds) {
  settle(call);
  call();
  const Clock::time_point start = Clock::now();
  call();
  return std::max<int64_t>(1, static_cast<int64_t>(target_seconds / std::max(seconds_since(start), 1e-7)));
}

double time_round(const std::function<void()>& call, int64_t calls) {
  settle(call);
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < calls; ++i) call();
  return seconds_since(start) / static_cast<double>(calls);
}

void set_threads(int threads) {
  set_num_threads(threads);
#ifdef LINGTRAIN_BENCH_OPENBLAS
  openblas_set_num_threads(threads);
#endif
}

// The routed experts' gate and up projections, kernels::grouped_matmuls: as two weights [E, I, H] whose
// products one call pairs expert by expert, and as one fused weight [E, 2I, H] (the model's: one product
// of twice the width, dx one product over K = 2I). moe-s's experts (16 segments of 256 rows, hidden 256,
// expert width 128), with the operands cycled through 8 sets (about 250 MiB) so that each call finds them
// outside the L2, in L3 or memory, as a training step does.
void bench_expert_gate_up(int rounds, double peak_gflops) {
  const int64_t E = 16, R = 256, H = 256, I = 128, M = E * R;
  std::vector<int64_t> bounds;
  for (int64_t e = 0; e <= E; ++e) bounds.push_back(e * R);
  const Tensor offsets = Tensor::from_vector<int64_t>({E + 1}, bounds);
  struct Operands {
    Tensor x, w_gate, w_up, w_gate_up, gate, up, gate_up, d_gate, d_up, d_gate_up, dx, dw_gate, dw_up, dw_gate_up;
  };
  std::vector<Operands> sets;
  Rng rng(3);
  for (int s = 0; s < 8; ++s) {
    Operands o{Tensor::randn({M, H}, rng), Tensor::randn({E, I, H}, rng), Tensor::randn({E, I, H}, rng),
               Tensor::randn({E, 2 * I, H}, rng), Tensor::empty({M, I}), Tensor::empty({M, I}),
               Tensor::empty({M, 2 * I}), Tensor::randn({M, I}, rng), Tensor::randn({M, I}, rng),
               Tensor::randn({M, 2 * I}, rng), Tensor::empty({M, H}), Tensor::empty({E, I, H}),
               Tensor::empty({E, I, H}), Tensor::empty({E, 2 * I, H})};
    sets.push_back(std::move(o));
  }
  using Run = std::function<void(Operands&, bool fused)>;
  const std::vector<std::pair<const char*, Run>> cases = {
      {"experts gate, up = x W^T",
       [&](Operands& o, bool fused) {
         if (fused) return kernels::grouped_matmul(o.x, o.w_gate_up, true, offsets, o.gate_up);
         kernels::grouped_matmuls({{o.x, o.w_gate, true, o.gate, 0.0}, {o.x, o.w_up, true, o.up, 0.0}}, offsets);
       }},
      {"experts dx = dgate W_gate + dup W_up",
       [&](Operands& o, bool fused) {
         if (fused) return kernels::grouped_matmul(o.d_gate_up, o.w_gate_up, false, offsets, o.dx);
         kernels::grouped_matmuls({{o.d_gate, o.w_gate, false, o.dx, 0.0}, {o.d_up, o.w_up, false, o.dx, 1.0}},
                                  offsets);
       }},
      {"experts dW_gate, dW_up = d^T x",
       [&](Operands& o, bool fused) {
         if (fused) return kernels::grouped_weight_grad(o.d_gate_up, o.x, offsets, o.dw_gate_up, 0.0);
         kernels::grouped_weight_grads({{o.d_gate, o.x, o.dw_gate, 0.0}, {o.d_up, o.x, o.dw_up, 0.0}}, offsets);
       }},
  };
  std::printf("%-52s %8s %7s %8s %7s %8s\n", "moe-s experts, gate and up (cold operands)", "paired", "%peak", "fused",
              "%peak", "fused/paired");
  const double flops = 2.0 * 2.0 * static_cast<double>(M * I * H) * static_cast<double>(sets.size());
  for (const auto& [label, run] : cases) {
    std::vector<double> paired, fused;
    for (int round = 0; round < rounds + 1; ++round)  // the first round warms up
      for (const bool fuse : {round % 2 == 0, round % 2 != 0}) {
        const Clock::time_point start = Clock::now();
        for (Operands& o : sets) run(o, fuse);
        if (round > 0) (fuse ? fused : paired).push_back(flops / seconds_since(start) / 1e9);
      }
    const double p = median(paired), f = median(fused);
    std::printf("%-52s %8.1f %6.0f%% %8.1f %6.0f%% %8.3f\n", label, p, 100.0 * p / peak_gflops, f,
                100.0 * f / peak_gflops, f / p);
  }
}

struct Options {
  int rounds = 7;
  std::vector<int> threads = {1, 2};
  std::string filter;
  bool bf16 = false;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (flag == "--rounds" && value) {
      options.rounds = std::max(1, std::atoi(value));
      ++i;
    } else if (flag == "--threads" && value) {
      options.threads.clear();
      for (const char* p = value; *p;) {
        options.threads.push_back(std::max(1, std::atoi(p)));
        p = std::strchr(p, ',') ? std::strchr(p, ',') + 1 : p + std::strlen(p);
      }
      ++i;
    } else if (flag == "--filter" && value) {
      options.filter = value;
      ++i;
    } else if (flag == "--dtype" && value && (std::strcmp(value, "f32") == 0 || std::strcmp(value, "bf16") == 0)) {
      options.bf16 = std::strcmp(value, "bf16") == 0;
      ++i;
    } else {
      std::fprintf(stderr, "gemm_bench: unknown argument '%s' (usage: gemm_bench [--rounds R] [--threads 1,2] "
                   "[--filter TEXT] [--dtype f32|bf16])\n", argv[i]);
      std::exit(2);
    }
  }
  return options;
}

int run(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    cap_cpu_target_from_environment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 2;
  }
  const std::vector<Shape3> shapes = bench_shapes();
  if (options.bf16 && !kernels::cpu_has_bf16_matmul()) {
    std::fprintf(stderr, "gemm_bench: --dtype bf16 needs a CPU with AVX512_BF16\n");
    return 2;
  }
  kernels::set_matmul_precision(options.bf16 ? kernels::MatmulPrecision::BF16Inputs : kernels::MatmulPrecision::F32);
  std::printf("gemm_bench: %s kernels::matmul, Highway target %s, L2 %lld KiB per core, median of %d rounds\n",
              options.bf16 ? "bf16-input" : "f32", cpu_kernel_target(),
              static_cast<long long>(cpu_l2_cache_bytes() >> 10), options.rounds);
#ifdef LINGTRAIN_BENCH_OPENBLAS
  std::printf("OpenBLAS: %s\n", openblas_get_config());
#else
  std::printf("OpenBLAS: not built in (install libopenblas-dev and reconfigure to compare)\n");
#endif
  for (int threads : options.threads) {
    set_threads(threads);
    const bench::FmaPeak peak = options.bf16 ? bench::measure_bf16_peak(threads) : bench::measure_fma_peak(threads);
    std::printf("\n%d thread%s: %s peak %.1f GFLOP/s (%s)\n", threads, threads == 1 ? "" : "s",
                options.bf16 ? "bf16" : "FMA", peak.gflops, peak.target);
    std::printf("%-52s %8s %7s %9s %7s %8s\n", "shape (M N K)", "ours", "%peak", "OpenBLAS", "%peak", "ours/OB");
    for (const Shape3& s : shapes) {
      if (s.label.find(options.filter) == std::string::npos) continue;
      Rng rng(1);
      const Tensor a = Tensor::randn(s.trans_a ? Shape{s.K, s.M} : Shape{s.M, s.K}, rng);
      const Tensor b = Tensor::randn(s.trans_b ? Shape{s.N, s.K} : Shape{s.K, s.N}, rng);
      Tensor ours_c = Tensor::empty({s.M, s.N});
      const auto ours = [&] { kernels::matmul(a, s.trans_a, b, s.trans_b, ours_c); };
      const double flops = 2.0 * static_cast<double>(s.M) * static_cast<double>(s.N) * static_cast<double>(s.K);
      const int64_t ours_calls = calls_per_round(ours, 0.02);
      std::vector<double> ours_rates, blas_rates;
#ifdef LINGTRAIN_BENCH_OPENBLAS
      Tensor blas_c = Tensor::empty({s.M, s.N});
      const auto blas = [&] {
        cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                    static_cast<int>(s.M), static_cast<int>(s.N), static_cast<int>(s.K), 1.0f, a.data<float>(),
                    static_cast<int>(s.trans_a ? s.M : s.K), b.data<float>(), static_cast<int>(s.trans_b ? s.K : s.N),
                    0.0f, blas_c.data<float>(), static_cast<int>(s.N));
      };
      const int64_t blas_calls = calls_per_round(blas, 0.02);
#endif
      for (int round = 0; round < options.rounds; ++round) {
        ours_rates.push_back(flops / time_round(ours, ours_calls) / 1e9);
#ifdef LINGTRAIN_BENCH_OPENBLAS
        blas_rates.push_back(flops / time_round(blas, blas_calls) / 1e9);
#endif
      }
      const std::string label = s.label + " (" + std::to_string(s.M) + " " + std::to_string(s.N) + " " +
                                std::to_string(s.K) + ")";
      const double ours_gflops = median(ours_rates);
      std::printf("%-52s %8.1f %6.0f%%", label.c_str(), ours_gflops, 100.0 * ours_gflops / peak.gflops);
#ifdef LINGTRAIN_BENCH_OPENBLAS
      // A sanity check that both computed the same product (they sum in different orders; bf16 inputs
      // carry 8 bits of mantissa).
      const std::vector<float> ours_v = ours_c.to_vector<float>(), blas_v = blas_c.to_vector<float>();
      double worst = 0;
      for (size_t i = 0; i < ours_v.size(); ++i)
        worst = std::max(worst, std::fabs(double(ours_v[i]) - blas_v[i]) / (1.0 + std::fabs(double(blas_v[i]))));
      const double blas_gflops = median(blas_rates);
      std::printf(" %9.1f %6.0f%% %8.2f%s", blas_gflops, 100.0 * blas_gflops / peak.gflops, ours_gflops / blas_gflops,
                  worst > (options.bf16 ? 3e-2 : 1e-3) ? "  MISMATCH" : "");
#endif
      std::printf("\n");
      std::fflush(stdout);
    }
    if (!options.bf16 && std::string("experts gate_up").find(options.filter) != std::string::npos)
      bench_expert_gate_up(std::max(options.rounds, 5), peak.gflops);
  }
  return 0;
}

}  // namespace
}  // namespace lt

int main(int argc, char** argv) { return lt::run(argc, argv); }
