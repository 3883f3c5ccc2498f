// The FMA peak loop, compiled for every Highway target and dispatched at run time like the kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/fma_peak.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include "bench/fma_peak.h"

HWY_BEFORE_NAMESPACE();
namespace lt::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Twelve independent accumulator chains: an FMA has a latency of 4 cycles and two units issue one
// each per cycle, so at least 8 chains are needed to keep both busy; 12 leaves slack for a longer
// latency and still fits the 16 vector registers of AVX2 with the two constants.
// Returns the FLOPs done, and writes the accumulators' sum so the loop cannot be optimised away. The
// chains start from different values that the compiler cannot see (`start` comes from the caller at
// run time): chains that provably compute the same thing are merged into one.
double FmaChains(int64_t iterations, float start, float* sink) {
  const hn::ScalableTag<float> d;
  const auto multiplier = hn::Set(d, 0.999f), addend = hn::Set(d, 0.001f);  // a fixed point at 1: no overflow
  const auto step = hn::Set(d, 1.0f / 16);
  auto a0 = hn::Iota(d, start), a1 = hn::Add(a0, step), a2 = hn::Add(a1, step), a3 = hn::Add(a2, step);
  auto a4 = hn::Add(a3, step), a5 = hn::Add(a4, step), a6 = hn::Add(a5, step), a7 = hn::Add(a6, step);
  auto a8 = hn::Add(a7, step), a9 = hn::Add(a8, step), a10 = hn::Add(a9, step), a11 = hn::Add(a10, step);
  for (int64_t i = 0; i < iterations; ++i) {
    a0 = hn::MulAdd(a0, multiplier, addend);
    a1 = hn::MulAdd(a1, multiplier, addend);
    a2 = hn::MulAdd(a2, multiplier, addend);
    a3 = hn::MulAdd(a3, multiplier, addend);
    a4 = hn::MulAdd(a4, multiplier, addend);
    a5 = hn::MulAdd(a5, multiplier, addend);
    a6 = hn::MulAdd(a6, multiplier, addend);
    a7 = hn::MulAdd(a7, multiplier, addend);
    a8 = hn::MulAdd(a8, multiplier, addend);
    a9 = hn::MulAdd(a9, multiplier, addend);
    a10 = hn::MulAdd(a10, multiplier, addend);
    a11 = hn::MulAdd(a11, multiplier, addend);
  }
  const auto total = hn::Add(hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7))),
                             hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  *sink = hn::GetLane(hn::SumOfLanes(d, total));
  return 2.0 * 12.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iterations);
}

int64_t LoopTarget() { return HWY_TARGET; }

}  // namespace lt::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <chrono>
#include <vector>

#include "tensor/cpu/amx.h"
#include "tensor/threadpool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

namespace lt::bench {

HWY_EXPORT(FmaChains);
HWY_EXPORT(LoopTarget);

namespace {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// FLOPs of `iterations` rounds of independent VDPBF16PS chains; the accumulators' sum goes to *sink.
__attribute__((target("avx512f,avx512bf16"))) double Bf16DotChains(int64_t iterations, float start, float* sink) {
  // Twelve chains, as in bench's FMA loop; operands of 1.0 and a tiny value keep every lane finite.
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(start + static_cast<float>(c));
  __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80), tiny = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], ones, tiny);
    // The compiler may not hoist the products out of the loop: it must assume `ones` changed.
    __asm__ volatile("" : "+v"(ones));
  }
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  *sink = 0;
  for (float lane : lanes) *sink += lane;
  return 4.0 * kChains * 16.0 * static_cast<double>(iterations);
}

// FLOPs of `iterations` rounds of six independent TDPBF16PS chains on the AMX tiles (tiles 0-5 accumulate
// the product of tiles 6 and 7, 16 x 16 x 32 multiply-adds each); a lane of the result goes to *sink.
__attribute__((target("amx-tile,amx-bf16"))) double AmxChains(int64_t iterations, float start, float* sink) {
  const cpu::AmxTileScope tiles(true);
  alignas(64) uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = i % 2 ? 0x3380 : 0x3F80;  // 1.0 and a tiny value: finite
  alignas(64) float accumulator[16 * 16];
  std::fill_n(accumulator, 16 * 16, start);
  _tile_loadd(0, accumulator, 64);
  _tile_loadd(1, accumulator, 64);
  _tile_loadd(2, accumulator, 64);
  _tile_loadd(3, accumulator, 64);
  _tile_loadd(4, accumulator, 64);
  _tile_loadd(5, accumulator, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  // A sixteenth of the VDPBF16PS loop's rounds: each instruction is 256 times the work.
  for (int64_t i = 0; i < iterations / 16; ++i) {
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(1, 6, 7);
    _tile_dpbf16ps(2, 6, 7);
    _tile_dpbf16ps(3, 6, 7);
    _tile_dpbf16ps(4, 6, 7);
    _tile_dpbf16ps(5, 6, 7);
  }
  _tile_stored(5, accumulator, 64);
  *sink = accumulator[0];
  return 6.0 * 2.0 * 16 * 16 * 32 * static_cast<double>(iterations / 16);
}
#endif

// The best rate of `chains` (a loop returning its FLOPs, kIterations rounds) on every thread at once.
FmaPeak best_rate(int threads, double seconds, const char* target, double (*chains)(int64_t, float, float*)) {
  const int previous_threads = num_threads();
  set_num_threads(threads);
  // One chunk per thread: parallel_for_slabs with grain 1 over `threads` items gives each worker one item.
  // 2^21 iterations are ~0.8 GFLOP per thread with 16 lanes, ~7 ms at 100 GFLOP/s: long enough to
  // dwarf the pool's dispatch, short enough for dozens of repetitions.
  constexpr int64_t kIterations = 1 << 21;
  std::vector<float> sinks(static_cast<size_t>(threads));
  std::vector<double> flops(static_cast<size_t>(threads));
  FmaPeak peak;
  peak.threads = threads;
  peak.target = target;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    const auto start = std::chrono::steady_clock::now();
    parallel_for_slabs(threads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) flops[t] = chains(kIterations, static_cast<float>(t), &sinks[t]);
    });
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double total = 0;
    for (double f : flops) total += f;
    peak.gflops = std::max(peak.gflops, total / elapsed / 1e9);
  } while (std::chrono::steady_clock::now() < deadline);
  set_num_threads(previous_threads);
  return peak;
}
}  // namespace

FmaPeak measure_fma_peak(int threads, double seconds) {
  return best_rate(threads, seconds, hwy::TargetName(HWY_DYNAMIC_DISPATCH(LoopTarget)()),
                   [](int64_t iterations, float start, float* sink) {
                     return HWY_DYNAMIC_DISPATCH(FmaChains)(iterations, start, sink);
                   });
}

FmaPeak measure_bf16_peak(int threads, double seconds) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (cpu::amx_tiles() == cpu::AmxTiles::Hardware) return best_rate(threads, seconds, "AMX", AmxChains);
  return best_rate(threads, seconds, "AVX512_BF16", Bf16DotChains);
#else
  return FmaPeak{0, threads, "none"};
#endif
}

}  // namespace lt::bench
#endif
