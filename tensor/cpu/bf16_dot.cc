#include "tensor/cpu/bf16_dot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LT_BF16_DOT_X86 1
// Everything the code below uses; the rest of the binary stays runnable on any x86-64.
#define LT_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))
#endif

namespace lt::cpu {

#if LT_BF16_DOT_X86

namespace {
// XGETBV: the OS saves the opmask and both halves of the 32 zmm registers (XCR0 bits 5, 6, 7) besides
// the SSE and AVX state (bits 1, 2); without that the instructions fault even where CPUID lists them.
bool os_saves_zmm() {
  if (!__builtin_cpu_supports("avx512f")) return false;
  uint32_t eax, edx;
  __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & 0xE6u) == 0xE6u;
}
}  // namespace

bool has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") && os_saves_zmm();
  return has;
}

LT_BF16_TARGET void accumulate_tile_bf16(int64_t pairs, const uint32_t* a_panel, const uint32_t* b_panel,
                                         int64_t b_stride, float* tile) {
  static_assert(kBf16TileColumns == 4 * 16, "four zmm of f32 per row");
  __m512 acc[kBf16TileRows][4];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  // Per k-pair: 4 loads of b, 6 broadcasts of a, 24 independent dot products (latency 6 on Zen 4, one
  // or two issued per cycle): enough chains in flight to keep the unit busy.
#pragma GCC unroll 2
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m512bh b[4];
    for (int v = 0; v < 4; ++v) b[v] = (__m512bh)_mm512_loadu_si512(b_panel + 16 * v);
    for (int r = 0; r < kBf16TileRows; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(a_panel[r]));
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
    }
    a_panel += kBf16TileRows;
    b_panel += b_stride;
  }
  for (int r = 0; r < kBf16TileRows; ++r)
    for (int v = 0; v < 4; ++v) _mm512_store_ps(tile + r * kBf16TileColumns + 16 * v, acc[r][v]);
}

namespace {
template <int kRows, int kVectors>
LT_BF16_TARGET void accumulate_rows(int64_t pairs, const uint32_t* a, int64_t a_row, int64_t a_pair,
                                    const uint32_t* b, int64_t b_stride, float* tile) {
  __m512 acc[kRows][kVectors];
  for (auto& row : acc)
    for (auto& v : row) v = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m512bh b_kp[kVectors];
    for (int v = 0; v < kVectors; ++v) b_kp[v] = (__m512bh)_mm512_loadu_si512(b + kp * b_stride + 16 * v);
    for (int r = 0; r < kRows; ++r) {
      const __m512bh a_rk = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * a_row + kp * a_pair]));
      for (int v = 0; v < kVectors; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a_rk, b_kp[v]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVectors; ++v) _mm512_store_ps(tile + r * kBf16TileColumns + 16 * v, acc[r][v]);
}

using AccumulateRows = void (*)(int64_t, const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, float*);
template <int kRows>
constexpr AccumulateRows kAccumulateRowsOf[4] = {accumulate_rows<kRows, 1>, accumulate_rows<kRows, 2>,
                                                 accumulate_rows<kRows, 3>, accumulate_rows<kRows, 4>};
constexpr const AccumulateRows* kAccumulateRows[kBf16TileRows] = {
    kAccumulateRowsOf<1>, kAccumulateRowsOf<2>, kAccumulateRowsOf<3>,
    kAccumulateRowsOf<4>, kAccumulateRowsOf<5>, kAccumulateRowsOf<6>};
}  // namespace

void accumulate_rows_bf16(int64_t pairs, int rows, int vectors, const uint32_t* a, int64_t a_row, int64_t a_pair,
                          const uint32_t* b, int64_t b_stride, float* tile) {
  kAccumulateRows[rows - 1][vectors - 1](pairs, a, a_row, a_pair, b, b_stride, tile);
}

namespace {
// Lanes [0, count) of 16, count clamped to [0, 16].
LT_BF16_TARGET __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}
}  // namespace

LT_BF16_TARGET void row_to_pairs(const float* src, int64_t n, uint32_t* dst) {
  // 32 floats -> 32 bf16 in order (the second operand fills the low half) = 16 pairs. A partial tail
  // loads zeros past n, so an odd n leaves its pad zero.
  for (int64_t i = 0; i < n; i += 32) {
    const int64_t rest = n - i;
    const __m512 low = _mm512_maskz_loadu_ps(first_lanes(rest), src + i);
    const __m512 high = _mm512_maskz_loadu_ps(first_lanes(rest - 16), src + i + 16);
    const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(high, low);
    _mm512_mask_storeu_epi32(dst + i / 2, first_lanes((rest + 1) / 2), pairs);
  }
}

LT_BF16_TARGET void interleave_to_pairs(const float* even, const float* odd, int64_t n, uint32_t* dst) {
  // cvtne2ps gives [even 0..15 | odd 0..15] as 16-bit lanes; the permutation zips the halves into
  // (even j, odd j) units.
  alignas(64) static constexpr uint16_t kZip[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i zip = _mm512_load_si512(kZip);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 lanes = first_lanes(n - j);
    const __m512 low = _mm512_maskz_loadu_ps(lanes, even + j);
    const __m512 high = odd ? _mm512_maskz_loadu_ps(lanes, odd + j) : _mm512_setzero_ps();
    const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(high, low);
    _mm512_mask_storeu_epi32(dst + j, lanes, _mm512_permutexvar_epi16(zip, halves));
  }
}

namespace {
// 16 bf16 values zero-extended into the low halves of 32-bit lanes. (The zero-masked form: GCC's plain
// one starts from an undefined register, which it warns about.)
LT_BF16_TARGET __m512i widen_16(const uint16_t* p) {
  return _mm512_maskz_cvtepu16_epi32(__mmask16(0xFFFF), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
}  // namespace

LT_BF16_TARGET void row_to_pairs(const uint16_t* src, int64_t n, uint32_t* dst) {
  // A copy: whole vectors unmasked, then a partial tail that loads zeros past n, so an odd n leaves its
  // pad zero.
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) _mm512_storeu_si512(dst + i / 2, _mm512_loadu_si512(src + i));
  if (i < n) {
    const int64_t rest = n - i;
    const __mmask32 values = __mmask32((uint64_t{1} << rest) - 1);
    _mm512_mask_storeu_epi32(dst + i / 2, first_lanes((rest + 1) / 2), _mm512_maskz_loadu_epi16(values, src + i));
  }
}

LT_BF16_TARGET void interleave_to_pairs(const uint16_t* even, const uint16_t* odd, int64_t n, uint32_t* dst) {
  // 16 values of each row zero-extended into 32-bit lanes, the odd row's shifted into the high halves;
  // whole vectors unmasked, then a partial tail through the permutation that zips two vectors' low lanes
  // (indices from 32 on pick from the second).
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i high =
        odd ? _mm512_maskz_slli_epi32(__mmask16(0xFFFF), widen_16(odd + j), 16) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + j, _mm512_or_si512(widen_16(even + j), high));
  }
  if (j == n) return;
  alignas(64) static constexpr uint16_t kZip[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __mmask16 lanes = first_lanes(n - j);
  const __m512i low = _mm512_maskz_loadu_epi16(__mmask32(lanes), even + j);
  const __m512i high = odd ? _mm512_maskz_loadu_epi16(__mmask32(lanes), odd + j) : _mm512_setzero_si512();
  _mm512_mask_storeu_epi32(dst + j, lanes, _mm512_permutex2var_epi16(low, _mm512_load_si512(kZip), high));
}

LT_BF16_TARGET void round_to_bf16(float* x, int64_t n) {
  // bf16 in the high half of each 32-bit lane is the widened value. (The zero-masked forms: GCC's plain
  // ones start from an undefined register, which it warns about.)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = first_lanes(n - i);
    const __m256i halves = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes, x + i));
    const __m512i widened = _mm512_maskz_slli_epi32(lanes, _mm512_maskz_cvtepu16_epi32(lanes, halves), 16);
    _mm512_mask_storeu_ps(x + i, lanes, _mm512_castsi512_ps(widened));
  }
}

#else

// Elsewhere nothing calls the kernels above (tensor/cpu/gemm.cc uses them on x86 AVX-512 targets only).
bool has_bf16_dot() { return false; }

#endif

}  // namespace lt::cpu
