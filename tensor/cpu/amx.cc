#include "tensor/cpu/amx.h"

#include <bit>
#include <cstdlib>
#include <cstring>

#include "tensor/cpu/bf16_dot.h"
#include "tensor/error.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define LT_AMX_X86 1
// The instructions are compiled with a function target attribute and run only after the run-time check.
#define LT_AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#endif

namespace lt::cpu {

namespace {

#if LT_AMX_X86
// Linux's arch_prctl request for a dynamically enabled state component, and the tile data's component.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtileData = 18;

// CPUID read directly: clang 14's __builtin_cpu_supports knows no "amx-tile" or "amx-bf16" (GCC's does).
// Leaf 1 ECX bit 27 (OSXSAVE: XGETBV may run), leaf 7 EDX bits 24 (AMX-TILE) and 22 (AMX-BF16).
bool cpu_reports_amx_bf16() {
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned int amx_tile_and_bf16 = (1u << 24) | (1u << 22);
  return (edx & amx_tile_and_bf16) == amx_tile_and_bf16;
}

bool ask_for_tiles() {
  if (!cpu_reports_amx_bf16()) return false;
  // XCR0 bits 17 and 18 (the tile configuration and data): the OS manages the tile state.
  uint32_t eax, edx;
  __asm__("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  if ((eax & (3u << 17)) != (3u << 17)) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
}

// LDTILECFG's 64-byte operand: palette 1, then per tile its bytes per row and its rows.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};
#endif

AmxTiles initial_tiles() {
  const char* value = std::getenv("LINGTRAIN_CPU_AMX");
  const bool wanted = value == nullptr || *value == '\0' || std::strcmp(value, "1") == 0;
  LT_CHECK(wanted || std::strcmp(value, "0") == 0, "LINGTRAIN_CPU_AMX=", value,
           " must be 0 (no AMX tiles) or 1 (the tiles where the CPU has them)");
  return wanted && has_amx_bf16() ? AmxTiles::Hardware : AmxTiles::Off;
}

AmxTiles& current_tiles() {
  static AmxTiles tiles = initial_tiles();
  return tiles;
}

// The emulated TDPBF16PS of one 16 x 16 tile: c[m][n] += the products of row m of a and column n of b,
// pair by pair in k order, the even k of a pair first (each product is exact in f32).
void emulated_tile_product(const uint32_t* a, int64_t a_stride, const uint32_t* b, int64_t b_stride, float* c,
                           int64_t c_stride) {
  const auto low = [](uint32_t pair) { return std::bit_cast<float>(pair << 16); };
  const auto high = [](uint32_t pair) { return std::bit_cast<float>(pair & 0xFFFF0000u); };
  for (int64_t m = 0; m < 16; ++m)
    for (int64_t n = 0; n < 16; ++n) {
      float sum = c[m * c_stride + n];
      for (int64_t kp = 0; kp < kAmxDepthUnits; ++kp) {
        const uint32_t x = a[m * a_stride + kp], y = b[kp * b_stride + n];
        sum += low(x) * low(y);
        sum += high(x) * high(y);
      }
      c[m * c_stride + n] = sum;
    }
}

void emulated_block(int64_t units, const uint32_t* a_rows, int64_t a_stride, const uint32_t* b_panel, float* block) {
  std::memset(block, 0, sizeof(float) * kAmxBlockRows * kAmxBlockColumns);
  for (int64_t u = 0; u < units; u += kAmxDepthUnits)
    for (int64_t m0 = 0; m0 < kAmxBlockRows; m0 += 16)
      for (int64_t n0 = 0; n0 < kAmxBlockColumns; n0 += 16)
        emulated_tile_product(a_rows + m0 * a_stride + u, a_stride, b_panel + u * kAmxBlockColumns + n0,
                              kAmxBlockColumns, block + m0 * kAmxBlockColumns + n0, kAmxBlockColumns);
}

#if LT_AMX_X86
constexpr TileConfig eight_full_tiles() {
  TileConfig config{};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  return config;
}

// A constant in memory: the compiler sees no read of a local configuration in LDTILECFG's intrinsic and
// would drop the stores that fill it.
constexpr TileConfig kEightFullTiles = eight_full_tiles();

LT_AMX_TARGET void configure_tiles() { _tile_loadconfig(&kEightFullTiles); }

LT_AMX_TARGET void release_tiles() { _tile_release(); }

// Tiles 0-3 accumulate the 2 x 2 tiles of one 32 x 32 half of the block, 4-5 hold A's two 16-row tiles
// and 6-7 B's two 16-column tiles: per 16 k-pairs, four loads of 1 KiB each feed four products, each
// tile of A and of B used twice.
LT_AMX_TARGET void hardware_block(int64_t units, const uint32_t* a_rows, int64_t a_stride, const uint32_t* b_panel,
                                  float* block) {
  const int64_t a_bytes = a_stride * 4, b_bytes = kAmxBlockColumns * 4, c_bytes = kAmxBlockColumns * 4;
  for (int64_t half = 0; half < kAmxBlockColumns; half += 32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t u = 0; u < units; u += kAmxDepthUnits) {
      _tile_loadd(4, a_rows + u, a_bytes);
      _tile_loadd(5, a_rows + 16 * a_stride + u, a_bytes);
      _tile_loadd(6, b_panel + u * kAmxBlockColumns + half, b_bytes);
      _tile_loadd(7, b_panel + u * kAmxBlockColumns + half + 16, b_bytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, block + half, c_bytes);
    _tile_stored(1, block + half + 16, c_bytes);
    _tile_stored(2, block + 16 * kAmxBlockColumns + half, c_bytes);
    _tile_stored(3, block + 16 * kAmxBlockColumns + half + 16, c_bytes);
  }
}
#endif

}  // namespace

bool has_amx_bf16() {
#if LT_AMX_X86
  static const bool has = ask_for_tiles();
  return has;
#else
  return false;
#endif
}

AmxTiles amx_tiles() { return current_tiles(); }

void set_amx_tiles(AmxTiles tiles) {
  LT_CHECK(tiles != AmxTiles::Hardware || has_amx_bf16(), "this CPU (or its kernel) gives no AMX-BF16 tiles");
  LT_CHECK(tiles != AmxTiles::Emulated || has_bf16_dot(), "emulated AMX tiles need AVX512_BF16 for the packing");
  current_tiles() = tiles;
}

AmxTileScope::AmxTileScope(bool use) : active_(use && current_tiles() == AmxTiles::Hardware) {
#if LT_AMX_X86
  if (active_) configure_tiles();
#endif
}

AmxTileScope::~AmxTileScope() {
#if LT_AMX_X86
  if (active_) release_tiles();
#endif
}

void amx_block(int64_t units, const uint32_t* a_rows, int64_t a_stride, const uint32_t* b_panel, float* block) {
#if LT_AMX_X86
  if (current_tiles() == AmxTiles::Hardware) return hardware_block(units, a_rows, a_stride, b_panel, block);
#endif
  emulated_block(units, a_rows, a_stride, b_panel, block);
}

}  // namespace lt::cpu
