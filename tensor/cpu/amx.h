// AMX (Advanced Matrix Extensions, Intel Xeon from Sapphire Rapids on): eight tile registers of up to 16
// rows x 64 bytes and a tile unit that multiplies them. TDPBF16PS adds to a 16 x 16 f32 tile C the
// product of a 16 x 32 bf16 tile A (16 rows of C, 16 k-pairs each) and a 32 x 16 bf16 tile B (16
// k-pairs, each a row of 16 columns): 8,192 multiply-adds in one instruction, issued every 16 cycles:
// 14-15 times the f32 FMA peak of the same core and 30 times its VDPBF16PS rate, as measured on a
// Sapphire Rapids-class Xeon (docs/performance.md, "AMX tiles for --dtype bf16"). The bf16 GEMM of
// tensor/cpu/gemm.cc multiplies its panels here where the CPU has it; its operands are the same
// "pairs" as VDPBF16PS's (tensor/cpu/bf16_dot.h): A as rows of C with the k-pairs of each row side by
// side, B as the pairs of each column side by side in rows of k-pairs, the layout of the packed B panels.
//
// The tiles are process state the kernel must grant (Linux's ARCH_REQ_XCOMP_PERM: the tile data is 8 KiB
// of each thread's saved state) and thread state each thread configures before use (LDTILECFG), so the
// GEMM brackets its use with AmxTileScope.
//
// Numerics: each product of two bf16 values is exact in f32 and the sums are f32, as with VDPBF16PS, but
// one instruction adds 32 products per element: the order of those sums is the hardware's, so the bits
// can differ from the VDPBF16PS path's (both are the bf16 contract: rounded operands, f32 sums). The
// arithmetic of an element depends only on K and its k-blocks, never on which tile or thread computes it.
#pragma once
#include <cstdint>

namespace lt::cpu {

// Which tile unit the bf16 GEMM uses:
//   Off: none, the VDPBF16PS micro-kernel (CPUs without AMX, or LINGTRAIN_CPU_AMX=0 in the environment);
//   Hardware: the CPU's AMX tiles (the default where the CPU has AMX-BF16 and the kernel grants them);
//   Emulated: the same blocking and packing with each tile instruction computed in C++, in k order, so
//     that the AMX path's logic runs in the tests of any x86 CPU with AVX512_BF16.
enum class AmxTiles { Off, Hardware, Emulated };

// True when the CPU has AMX-BF16 and the kernel granted this process the tile data (asked once).
bool has_amx_bf16();
// The tiles in use; the first call reads LINGTRAIN_CPU_AMX (0 or 1, else an error).
AmxTiles amx_tiles();
// For tests and benchmarks: Hardware only where has_amx_bf16(), Emulated only where has_bf16_dot().
void set_amx_tiles(AmxTiles tiles);

// The rows of a C block: two tiles of 16, and the columns: one packed B panel of 64 (two halves of 32).
constexpr int64_t kAmxBlockRows = 32;
constexpr int64_t kAmxBlockColumns = 64;
// k-pairs per tile instruction: A's and B's depth is a multiple of it (zero-padded).
constexpr int64_t kAmxDepthUnits = 16;

// When `use` and the tiles are the hardware's: loads the tile configuration of amx_block (eight 16 x
// 64-byte tiles) in this thread on construction, and releases the tiles on destruction: a thread whose
// tiles are in their initial state has no tile data for context switches to save.
class AmxTileScope {
 public:
  explicit AmxTileScope(bool use);
  ~AmxTileScope();
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;

 private:
  bool active_;
};

// block[32][64] (row-major, 64-byte aligned) = a_rows [32][units] (rows a_stride units apart) times
// b_panel [units][64] (rows of 64 units), summed over `units` k-pairs in steps of kAmxDepthUnits; units
// is a multiple of kAmxDepthUnits. Inside an AmxTileScope (or in emulation).
void amx_block(int64_t units, const uint32_t* a_rows, int64_t a_stride, const uint32_t* b_panel, float* block);

}  // namespace lt::cpu
