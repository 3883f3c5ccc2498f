#include "tensor/cpu/bf16_dot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define LT_BF16_DOT_X86 1
// Everything the code below uses; the rest of the binary stays runnable on any x86-64.
#define LT_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
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

#else

bool has_bf16_dot() { return false; }
void accumulate_tile_bf16(int64_t, const uint32_t*, const uint32_t*, int64_t, float*) {}

#endif

}  // namespace lt::cpu
