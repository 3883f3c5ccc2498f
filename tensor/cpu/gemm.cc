// Matrix multiply: c = alpha * op(a) @ op(b) + beta * c, with every transpose variant the forward and
// backward passes need, batched or not.
//
// A GotoBLAS/BLIS-style GEMM. C is computed in register tiles of kTileRows rows x kTileVectors vectors
// (MR x NR elements) by one micro-kernel: per k it loads NR values of op(b) as vectors, broadcasts MR
// values of op(a) and issues MR x kTileVectors FMAs. Both operands are first repacked into the order
// the micro-kernel reads them, which also absorbs the transposes (except where a thread's share of C is
// narrow: a packed panel would then be read too few times to pay for its copy, and op(a), and b [K, N]
// for a few hundred rows, are read where they lie):
//   op(a) -> MR-row panels [k][MR]. From a [K, M] (transposed) the MR values of one k are contiguous;
//     from a [M, K] a panel is a transpose of MR rows, done with vector shuffles for f32.
//   op(b) -> NR-column panels [k][NR]. From b [K, N] a copy of row pieces; from b [N, K] (transposed)
//     a register transpose of Lanes x Lanes blocks.
// Around the micro-kernel, three cache blocks (BLIS's names; the roles are those of row-major C):
//   KC (depth): an A micro-panel KC x MR stays in L1 while it meets every B micro-panel of the block;
//   NC (columns): the packed B block KC x NC stays in L2 while the A micro-panels stream past it;
//   MC (rows): the packed A block MC x KC is reused for all NC blocks; B is repacked once per MC rows.
// Threads split C into slabs of whole tiles (along N or M), each thread packing what its slab needs
// into its own buffers: one fork-join per GEMM, no shared state.
// Few rows of C (decoding, small expert segments) take cheaper routes: b [K, N] is read in place
// instead of packed, and against a transposed b [N, K] each element is a dot product of two rows that
// are contiguous in k, with nothing packed.
//
// Mixed precision (MatmulPrecision::BF16Inputs, f32 only, on a CPU with AVX512_BF16): the panel path
// packs both operands as bf16, rounded to nearest even like Tensor::to, in "pairs" (two consecutive k's
// of one row or column in a 32-bit unit, tensor/cpu/bf16_dot.h), and its micro-kernel multiplies them
// with VDPBF16PS into f32 accumulators: the contract of the GPU's bf16 GEMMs, at twice the f32 FMA rate
// and half the packed footprint. The k-pairs make the packing a conversion plus the f32 packing's own
// moves on 32-bit units: a [M, K] row converted to bf16 is already a row of pairs, and two k-rows of a
// [K, N] b interleave into one row of pairs. An operand held in bf16 (an activation kept for the backward,
// autograd/saved.h) has its pairs moved instead of converted, half the bytes read. The few-row paths stay
// f32 (widening an operand held in bf16): they are bound by reading b, and converting it would cost more
// than its FMAs. Where the CPU has AMX tiles (tensor/cpu/amx.h) the
// panels are multiplied there instead, 32 rows x 64 columns per block: B keeps its packed panels, and A
// is packed as rows of pairs (the tiles' A operand is 16 rows of C with their k-pairs side by side), both
// zero-padded to whole steps of 16 pairs and A to whole blocks of 32 rows.
//
// Numerics and determinism: on the panel path each element of C is one FMA chain over k, in k order,
// within a KC block, then written back as alpha * acc + beta * c (beta = 1 after the first KC block);
// the KC blocks depend only on K. An addend (matmul_add) joins each element after its last KC block,
// as a separate rounding: c = (alpha op(a) op(b) + beta c) + addend has the bits of matmul then add. On the dot path
// each element is Lanes partial sums over k, reduced across lanes. Neither the position of a tile, nor packing, nor
// which thread computes it changes that arithmetic, so for given shapes the result is bit-identical for any thread
// count (on a given Highway target). Which path runs depends on the shapes only (M and the transposes).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/gemm.cc"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/amx.h"
#include "tensor/cpu/bf16-inl.h"
#include "tensor/cpu/bf16_dot.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/transpose-inl.h"
#include "tensor/dtype_switch.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

// Shared by every target's code below and by gemm_column_block_bytes: defined once, though Highway
// compiles this file once per target.
#ifndef LT_TENSOR_CPU_GEMM_BLOCKS
#define LT_TENSOR_CPU_GEMM_BLOCKS
namespace lt::cpu {
// Cache blocks, in bytes so that f64 keeps the footprint of f32. KC = 256 floats: an A micro-panel is
// 256 x 6 x 4 = 6 KiB of a 48 KiB L1 (32 KiB on Zen 3 and 4), and the C tile is reread once per 256 k's.
// NC (gemm_column_block_bytes): as many columns as keep the packed B block in the L2 read at start-up,
// at most 1024 floats. 1024 makes the block 256 x 1024 x 4 = 1 MiB: half of the 2 MiB L2 of the Xeon
// (Sapphire Rapids) this GEMM was first written on, and all of Zen 4's 1 MiB, where 512, 1024 and 2048
// columns measured alike (docs/performance.md). Zen 3's 512 KiB L2 gets 512 columns. MC = 2048 rows:
// the packed A block is 2 MiB in L2/L3, and each packed B element then feeds 2048 FMAs, so repacking B
// costs well under 1% of the time.
constexpr int64_t kDepthBlockBytes = 1024;
constexpr int64_t kMaxColumnBlockBytes = 4096;
constexpr int64_t kRowBlock = 2048;

// The operands a kernels::ReusedMatmulOperands scope declares constant, and the packed panels of those
// that the panel path has met as b, each packed on its second use and kept until the scope ends: a
// decoding step multiplies every weight by a handful of rows, and packing it anew each step cost as much
// as the product. Not on the first: a weight used once (one prompt's prefill) is packed as it goes, in
// L2-sized blocks by every thread, with nothing to allocate. Found by b's address, layout and the
// target's panel width.
struct ReusedOperands {
  struct Key {
    const void* b;
    int64_t K, N, ldb;
    bool trans_b;
    size_t element_bytes;
    int64_t tile_cols;
    bool operator==(const Key&) const = default;
  };
  struct Packed {
    Key key;
    hwy::AlignedFreeUniquePtr<uint8_t[]> panels;
  };
  // Held, so their storage cannot be freed and reused for other data while the scope lives.
  std::vector<Tensor> constants;
  // A few per layer: searched in order.
  std::vector<Key> seen_once;
  std::vector<Packed> packed;
  ReusedOperands* outer = nullptr;

  bool holds(const void* first, int64_t bytes) const {
    const char* begin = static_cast<const char*>(first);
    for (const Tensor& t : constants) {
      const char* data = static_cast<const char*>(t.raw_data());
      const int64_t size = t.numel() * static_cast<int64_t>(dtype_size(t.dtype()));
      if (begin >= data && begin + bytes <= data + size) return true;
    }
    return false;
  }
};
// The innermost scope of this thread (GEMMs called from other threads pack as usual).
thread_local ReusedOperands* reused_operands = nullptr;
}  // namespace lt::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register budget of the micro-kernel: kTileRows x kTileVectors accumulators, kTileVectors B vectors and
// one broadcast of A must fit the vector registers. Each k step issues kTileRows x kTileVectors
// independent FMAs (at least 8 are needed to cover a 4-cycle FMA latency on two FMA ports) for
// kTileVectors + kTileRows loads. AVX-512 has 32 registers: 6 x 4 = 24 accumulators + 4 + 1; of the
// 24-accumulator shapes it needs the fewest loads per FMA (10 per 24, against 14 for 12 x 2), and it
// measured fastest on this Xeon (kernel-only loop, GFLOP/s: 6 x 4 191, 14 x 2 183, 12 x 2 180, 8 x 3 175,
// 4 x 6 159). The targets with 16 registers (AVX2, SSE4) use 6 x 2 = 12 accumulators + 2 + 1.
constexpr int kTileRows = 6;
#undef LT_GEMM_BF16  // this file is compiled once per target
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kTileVectors = 4;
// The bf16 micro-kernel (tensor/cpu/bf16_dot.cc) has this target's tile: the packing is shared.
#define LT_GEMM_BF16 1
static_assert(kTileRows == kBf16TileRows && kTileVectors * 16 == kBf16TileColumns, "one tile for f32 and bf16");
#else
constexpr int kTileVectors = 2;
#endif

// Operands read in place by the f32 panel path instead of packed. Up to kFewRows rows of C, b [K, N]:
// each of its elements meets at most two A micro-panels. (A transposed b with few rows of C takes the
// dot-product path below.) And in a thread's share of at most kNarrowColumns columns of C: op(a), whose
// micro-panels then meet at most 4 B micro-panels each (AVX-512), and b [K, N] up to kMaxRowsUnpackedB
// rows, its block then a quarter of the L2 at most and met by at most ~85 A micro-panels. Packing
// cost 5-17% of such GEMMs, measured on Zen 4 (gemm_bench, 2 threads): the weight gradients, the
// experts' segments, the NormHead loss's 256-row chunks. Wider shares reuse each packed panel often
// enough for its contiguity to pay (1-13% faster packed at 512-4096 columns).
constexpr int64_t kFewRows = 2 * kTileRows;
constexpr int64_t kNarrowColumns = 256;
constexpr int64_t kMaxRowsUnpackedB = 512;

// A transposed a [K, M] whose k's lie more than a page apart is packed even on the AVX-512 tile: each k
// of a micro-panel is then a line on its own page, which no hardware prefetcher follows, and with a
// power-of-two lda the KC lines crowd into a few sets of the L2. On the Xeon (Emerald Rapids, the device
// machine's CPU) every tile then refetched them from L3: NormHead's dW chunk (M N K = 4096 256 256,
// lda = vocab) ran at 40-42% of the peak in place and 74-77% packed, on 1 and 2 threads. At lda = 1024
// (4 KiB) in place was as fast there (79-82% against 73-78%). Zen 4 hides the refetches: packing
// cost it 7% on that chunk, under 0.5% of a moe-s step. Such a block is packed 512 rows at a time
// (512 KiB): it stays in L2, and the pack buffer is no larger than the other GEMMs' of a step (2048-row
// blocks cost 9% on Zen 4 and raised moe-s's peak RSS by 3.6 MiB on 2 threads).
constexpr int64_t kPageBytes = 4096;
constexpr int64_t kFarApartRowBlock = 512;

// Up to this many rows of C against a transposed b [N, K] (x W^T for a handful of tokens: decoding, a
// small expert segment), C is computed as dot products of rows, which are contiguous in k in both
// operands, and nothing is packed: the panel path would transpose all of b for a few rows' worth of
// FMAs. Measured crossover on this Xeon: the panel path wins from about two row panels (12 rows) on.
constexpr int64_t kMaxRowsDot = 2 * kTileRows;

// Up to this many rows of C, a b that a ReusedMatmulOperands scope holds takes the panel path, whatever
// the row count (one row included, which would otherwise take the dot-product path), packed once and read
// from there (ReusedPackedB): the rows of a decoding step. On the panel path a row's bits do not depend on
// how many rows go with it, so a row decoded in a batch, or prefilled with other prompts, gets the bits it
// gets alone (greedy decoding then picks the same tokens, ties included). More rows reuse each packed
// block of B enough that packing it into L2 as it goes (and reading it from there) costs little.
constexpr int64_t kMaxRowsReusedB = 4 * kTileRows;

template <class T>
struct Gemm {
  int64_t M, N, K;
  const T* a;
  int64_t lda;
  bool trans_a;
  const T* b;
  int64_t ldb;
  bool trans_b;
  T* c;
  int64_t ldc;
  T alpha, beta;
  bool bf16_inputs;  // the panel path multiplies bf16 pairs (only set for f32 where the CPU has them)
  // Operands gathered by row: the storage row that row i of a (op(a)'s row i, or its k = i when a is
  // transposed) and row k of a b [K, N] are read from; nullptr reads them in order. A gathered row is
  // read where the packing or the in-place micro-kernel would read it anyway, so the gather costs no
  // pass of its own (the experts' rows in dispatch order, read from the tokens' rows).
  const int32_t* a_rows = nullptr;
  const int32_t* b_rows = nullptr;
  // Added to C once its product is complete, ldc apart like C's rows (nullptr: none). Read in the pass
  // that writes C, it saves the separate add's pass over C (the residual stream joining a projection).
  const T* addend = nullptr;
  // op(b) packed whole (ReusedPackedB), in place of packing it block by block; nullptr: packed as it goes.
  const T* b_packed = nullptr;
  // The same for the bf16 panel path: op(b) in pairs, packed whole beforehand (PackPairsBWhole's layout)
  // for several GEMMs against it; read only where bf16_inputs.
  const uint32_t* b_pairs = nullptr;
  // An operand held in bf16 (an activation kept for the backward, autograd/saved.h), in place of a or b
  // (nullptr then), laid out as that would be (leading dimension, gathers): the bf16 packing moves its
  // pairs (no conversion, half the bytes); the paths that read f32 read it widened (WithF32Operands).
  const uint16_t* a_bf16 = nullptr;
  const uint16_t* b_bf16 = nullptr;
};

// Row i of a's storage and row k of b's, through the gathers.
template <class T>
const T* RowOfA(const Gemm<T>& g, int64_t i) {
  return g.a + (g.a_rows ? g.a_rows[i] : i) * g.lda;
}
template <class T>
const T* RowOfB(const Gemm<T>& g, int64_t k) {
  return g.b + (g.b_rows ? g.b_rows[k] : k) * g.ldb;
}

// A per-thread packing buffer (kWhich: 0 for A, 1 for B; 2 to 5 below) that grows to the largest size seen and is
// then reused, so steady-state calls allocate nothing. Aligned so packed panels start on a cache line.
template <class T, int kWhich>
T* PackBuffer(int64_t n) {
  static thread_local hwy::AlignedFreeUniquePtr<T[]> buffer;
  static thread_local int64_t capacity = 0;
  if (capacity < n) {
    buffer = hwy::AllocateAligned<T>(static_cast<size_t>(n));
    capacity = n;
  }
  return buffer.get();
}

int64_t CeilDiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

// The depth of the panel path's KC blocks, a function of K alone: (nearly) equal blocks whose count is the
// fewest that fit kDepthBlockBytes, so the rounding points of the sum over k do not depend on M or N. In
// bf16 pairs (kPerUnit 2) a block holds twice the k's (the same bytes) and starts at an even k.
template <class P, int64_t kPerUnit>
int64_t DepthStep(int64_t K) {
  const int64_t fitting_blocks = std::max<int64_t>(1, CeilDiv(K, kPerUnit * kDepthBlockBytes / int64_t(sizeof(P))));
  return std::max<int64_t>(1, CeilDiv(CeilDiv(K, fitting_blocks), kPerUnit)) * kPerUnit;
}

#if HWY_TARGET != HWY_SCALAR
// panel[k * MR + r] = src[r][k] for the MR = 6 rows of a full panel of 32-bit elements (f32, or the bf16
// pairs), for k below depth rounded down to Lanes; returns that depth. A pair
// of rows zipped is one 64-bit lane per k, and an MR-row panel is then three such lanes interleaved: per
// Lanes k's, 6 loads, 6 permutes, 6 zips and two 3-way interleaved stores, against 6 loads and 6 stores
// per k for a scalar transpose.
template <class D, class T = hn::TFromD<D>>
int64_t InterleaveSixRows(D d, const T* const* src, int64_t depth, T* HWY_RESTRICT panel) {
  static_assert(kTileRows == 6 && sizeof(T) == 4, "three pairs of 32-bit rows");
  const hn::Repartition<uint64_t, D> d64;
  using V = hn::Vec<D>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  // InterleaveLower/Upper zip within 128-bit blocks. Permuting each row first so that block b holds
  // k = 2b, 2b + 1 and Lanes/2 + 2b, Lanes/2 + 2b + 1 makes the lower zip cover k < Lanes/2 in order
  // and the upper zip the rest.
  HWY_ALIGN int32_t order[HWY_MAX_BYTES / sizeof(float)];
  for (int64_t i = 0; i < lanes; ++i)
    order[i] = static_cast<int32_t>(i % 4 < 2 ? 2 * (i / 4) + i % 4 : lanes / 2 + 2 * (i / 4) + i % 4 - 2);
  const auto permute = hn::SetTableIndices(d, order);
  const int64_t vector_depth = depth / lanes * lanes;
  for (int64_t k = 0; k < vector_depth; k += lanes) {
    V row[kTileRows];
    for (int r = 0; r < kTileRows; ++r) row[r] = hn::TableLookupLanes(hn::LoadU(d, src[r] + k), permute);
    auto* out = reinterpret_cast<uint64_t*>(panel + k * kTileRows);
    hn::StoreInterleaved3(hn::BitCast(d64, hn::InterleaveLower(d, row[0], row[1])),
                          hn::BitCast(d64, hn::InterleaveLower(d, row[2], row[3])),
                          hn::BitCast(d64, hn::InterleaveLower(d, row[4], row[5])), d64, out);
    hn::StoreInterleaved3(hn::BitCast(d64, hn::InterleaveUpper(d, row[0], row[1])),
                          hn::BitCast(d64, hn::InterleaveUpper(d, row[2], row[3])),
                          hn::BitCast(d64, hn::InterleaveUpper(d, row[4], row[5])), d64,
                          out + lanes / 2 * kTileRows / 2);
  }
  return vector_depth;
}
#endif

// Packs op(a)[i0 : i0 + rows, p0 : p0 + depth] into MR-row panels [k][MR]. Rows past `rows` are zero,
// so the micro-kernel never needs a row count.
template <class D, class T = hn::TFromD<D>>
void PackA([[maybe_unused]] D d, const Gemm<T>& g, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
           T* HWY_RESTRICT dst) {
  const int64_t panels = CeilDiv(rows, kTileRows), full_panels = rows / kTileRows;
  if (g.trans_a) {
    // a is [K, M]: row k of a holds the MR values at k of every panel. Rows are read a few at a time,
    // sequentially, rather than MR values per row across rows (one cache miss each), and each panel
    // receives kPackRowsA k's at once: 8 x 6 floats, three whole cache lines, where a row at a time
    // wrote 24 bytes into each of M / 6 panels in turn. The copy of a full panel's k has a constant
    // length, so it compiles to two moves, not a call.
    constexpr int64_t kPackRowsA = 8;
    for (int64_t k0 = 0; k0 < depth; k0 += kPackRowsA) {
      const int64_t k1 = std::min(depth, k0 + kPackRowsA);
      for (int64_t p = 0; p < full_panels; ++p)
        for (int64_t k = k0; k < k1; ++k)
          std::memcpy(dst + (p * depth + k) * kTileRows, RowOfA(g, p0 + k) + i0 + p * kTileRows, kTileRows * sizeof(T));
      if (full_panels < panels)
        for (int64_t k = k0; k < k1; ++k) {
          const T* src = RowOfA(g, p0 + k) + i0 + full_panels * kTileRows;
          T* out = dst + (full_panels * depth + k) * kTileRows;
          for (int64_t r = 0; r < kTileRows; ++r) out[r] = full_panels * kTileRows + r < rows ? src[r] : T(0);
        }
    }
    return;
  }
  // a is [M, K]: each panel is a transpose of MR rows.
  for (int64_t p = 0; p < panels; ++p) {
    T* panel = dst + p * depth * kTileRows;
    const int64_t valid = std::min<int64_t>(kTileRows, rows - p * kTileRows);
    const T* src[kTileRows];
    for (int64_t r = 0; r < valid; ++r) src[r] = RowOfA(g, i0 + p * kTileRows + r) + p0;
    int64_t k = 0;
#if HWY_TARGET != HWY_SCALAR
    if constexpr (sizeof(T) == 4)
      if (valid == kTileRows) k = InterleaveSixRows(d, src, depth, panel);
#endif
    for (; k < depth; ++k)
      for (int64_t r = 0; r < kTileRows; ++r) panel[k * kTileRows + r] = r < valid ? src[r][k] : T(0);
  }
}

// Packs op(b)[p0 : p0 + depth, j0 : j0 + cols] into NR-column panels [k][NR], zero-padding the last.
template <class D, class T = hn::TFromD<D>>
void PackB(D d, const Gemm<T>& g, int64_t p0, int64_t depth, int64_t j0, int64_t cols, T* HWY_RESTRICT dst) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t tile_cols = kTileVectors * lanes;
  const int64_t panels = CeilDiv(cols, tile_cols);
  if (!g.trans_b) {
    // b is [K, N]: k outermost reads each row of the block sequentially.
    for (int64_t k = 0; k < depth; ++k) {
      const T* src = RowOfB(g, p0 + k) + j0;
      for (int64_t p = 0; p < panels; ++p) {
        T* out = dst + (p * depth + k) * tile_cols;
        const int64_t c0 = p * tile_cols, valid = std::min(tile_cols, cols - c0);
        if (valid == tile_cols) {
          for (int64_t col = 0; col < tile_cols; col += lanes) hn::Store(hn::LoadU(d, src + c0 + col), d, out + col);
        } else {
          std::memcpy(out, src + c0, static_cast<size_t>(valid) * sizeof(T));
          for (int64_t col = valid; col < tile_cols; ++col) out[col] = T(0);
        }
      }
    }
    return;
  }
  // b is [N, K]: column j of op(b) is row j of b, contiguous in k. Each panel is transposed in blocks of
  // Lanes columns x Lanes k's; a partial block of columns (the last panel) or of k's goes element-wise.
  for (int64_t p = 0; p < panels; ++p) {
    T* panel = dst + p * depth * tile_cols;
    for (int64_t first = 0; first < tile_cols; first += lanes) {
      const int64_t column = p * tile_cols + first;
      const int64_t valid = std::clamp<int64_t>(cols - column, 0, lanes);
      const T* src = g.b + (j0 + column) * g.ldb + p0;
      T* out = panel + first;
      int64_t k = 0;
#if HWY_TARGET != HWY_SCALAR
      if (valid == lanes)
        for (; k + lanes <= depth; k += lanes) TransposeBlock(d, src + k, g.ldb, out + k * tile_cols, tile_cols);
#endif
      for (; k < depth; ++k)
        for (int64_t i = 0; i < lanes; ++i) out[k * tile_cols + i] = i < valid ? src[i * g.ldb + k] : T(0);
    }
  }
}

#if LT_GEMM_BF16
// ---- bf16 pairs ----------------------------------------------------------------------------------
// The packing of the bf16 panel path. A unit holds bf16(x[k]) in its low half and bf16(x[k + 1]) in its
// high half (k even; past the end of a KC block, zero); a packed panel is the f32 panel's layout with
// one unit where f32 has one k, i.e. [k / 2][MR] for A and [k / 2][NR] for B. The conversions are
// row_to_pairs and interleave_to_pairs of tensor/cpu/bf16_dot.h; the moves are the f32 packing's.

// A scratch row of pairs per thread (kWhich 2), next to the packing buffers, and like them (GemmBlock) as
// large as any block needs from the first use on: Lanes rows of a row block's pairs (kRowBlock units,
// rounded up to whole vectors of up to 16 lanes).
uint32_t* PairScratch(int64_t units) {
  constexpr int64_t kLargestUnits = 16 * (kRowBlock + 16);
  return PackBuffer<uint32_t, 2>(std::max(units, kLargestUnits));
}

// One operand as the bf16 packing reads it, by rows of its storage (through a gather): converted from
// f32, or moved where it is held in bf16.
struct PairRows {
  const float* f32;
  const uint16_t* bf16;
  int64_t ld;
  const int32_t* gathered;
  int64_t start(int64_t i) const { return (gathered ? gathered[i] : i) * ld; }
  // dst = row i's n values from column `from`, as pairs (row_to_pairs).
  void row(int64_t i, int64_t from, int64_t n, uint32_t* dst) const {
    if (bf16) row_to_pairs(bf16 + start(i) + from, n, dst);
    else row_to_pairs(f32 + start(i) + from, n, dst);
  }
  // dst = rows even and odd (odd < 0: zeros) from column `from`, n units interleaved (interleave_to_pairs).
  void interleave(int64_t even, int64_t odd, int64_t from, int64_t n, uint32_t* dst) const {
    if (bf16) interleave_to_pairs(bf16 + start(even) + from, odd < 0 ? nullptr : bf16 + start(odd) + from, n, dst);
    else interleave_to_pairs(f32 + start(even) + from, odd < 0 ? nullptr : f32 + start(odd) + from, n, dst);
  }
};
PairRows PairRowsOfA(const Gemm<float>& g) { return {g.a, g.a_bf16, g.lda, g.a_rows}; }
PairRows PairRowsOfB(const Gemm<float>& g) { return {g.b, g.b_bf16, g.ldb, g.b_rows}; }

// PackA in pairs: op(a)[i0 : i0 + rows, p0 : p0 + depth] into MR-row panels [depth / 2][MR].
template <class DF>
void PackPairsA(DF df, const Gemm<float>& g, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
                uint32_t* HWY_RESTRICT dst) {
  const hn::RebindToUnsigned<DF> du;
  const int64_t units = CeilDiv(depth, 2), panels = CeilDiv(rows, kTileRows), full_panels = rows / kTileRows;
  const PairRows a = PairRowsOfA(g);
  if (g.trans_a) {
    // a is [K, M]: two k-rows of a make one row of pairs, which holds unit kp of every panel.
    uint32_t* pairs = PairScratch(rows);
    for (int64_t kp = 0; kp < units; ++kp) {
      a.interleave(p0 + 2 * kp, 2 * kp + 1 < depth ? p0 + 2 * kp + 1 : -1, i0, rows, pairs);
      for (int64_t p = 0; p < full_panels; ++p)
        std::memcpy(dst + (p * units + kp) * kTileRows, pairs + p * kTileRows, kTileRows * sizeof(uint32_t));
      if (full_panels < panels) {
        uint32_t* out = dst + (full_panels * units + kp) * kTileRows;
        for (int64_t r = 0; r < kTileRows; ++r)
          out[r] = full_panels * kTileRows + r < rows ? pairs[full_panels * kTileRows + r] : 0u;
      }
    }
    return;
  }
  // a is [M, K]: the MR rows of a panel become rows of pairs, then are transposed like f32 rows.
  uint32_t* pairs = PairScratch(kTileRows * units);
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t valid = std::min<int64_t>(kTileRows, rows - p * kTileRows);
    for (int64_t r = 0; r < kTileRows; ++r) {
      if (r < valid) a.row(i0 + p * kTileRows + r, p0, depth, pairs + r * units);
      else std::fill_n(pairs + r * units, units, 0u);
    }
    uint32_t* panel = dst + p * units * kTileRows;
    const uint32_t* pair_rows[kTileRows];
    for (int64_t r = 0; r < kTileRows; ++r) pair_rows[r] = pairs + r * units;
    for (int64_t k = InterleaveSixRows(du, pair_rows, units, panel); k < units; ++k)
      for (int64_t r = 0; r < kTileRows; ++r) panel[k * kTileRows + r] = pairs[r * units + k];
  }
}

// PackB in pairs: op(b)[p0 : p0 + depth, j0 : j0 + cols] into NR-column panels [padded_units][NR], the
// unit rows from depth / 2 to padded_units zero (the AMX tiles read whole steps of kAmxDepthUnits).
template <class DF>
void PackPairsB(DF df, const Gemm<float>& g, int64_t p0, int64_t depth, int64_t j0, int64_t cols, int64_t padded_units,
                uint32_t* HWY_RESTRICT dst) {
  const hn::RebindToUnsigned<DF> du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t tile_cols = kTileVectors * lanes;
  const int64_t units = CeilDiv(depth, 2), panels = CeilDiv(cols, tile_cols);
  for (int64_t p = 0; p < panels && padded_units > units; ++p)
    std::fill(dst + (p * padded_units + units) * tile_cols, dst + (p + 1) * padded_units * tile_cols, 0u);
  const PairRows b = PairRowsOfB(g);
  if (!g.trans_b) {
    // b is [K, N]: two k-rows of b interleave straight into unit row kp of every panel.
    for (int64_t kp = 0; kp < units; ++kp) {
      const int64_t odd = 2 * kp + 1 < depth ? p0 + 2 * kp + 1 : -1;
      for (int64_t p = 0; p < panels; ++p) {
        uint32_t* out = dst + (p * padded_units + kp) * tile_cols;
        const int64_t c0 = p * tile_cols, valid = std::min(tile_cols, cols - c0);
        b.interleave(p0 + 2 * kp, odd, j0 + c0, valid, out);
        std::fill(out + valid, out + tile_cols, 0u);
      }
    }
    return;
  }
  // b is [N, K]: Lanes rows of b (columns of op(b)) become rows of pairs, transposed in Lanes x Lanes
  // blocks of units like the f32 path's blocks of k's.
  uint32_t* pairs = PairScratch(lanes * units);
  for (int64_t p = 0; p < panels; ++p) {
    uint32_t* panel = dst + p * padded_units * tile_cols;
    for (int64_t first = 0; first < tile_cols; first += lanes) {
      const int64_t column = p * tile_cols + first;
      const int64_t valid = std::clamp<int64_t>(cols - column, 0, lanes);
      for (int64_t i = 0; i < lanes; ++i) {
        if (i < valid) b.row(j0 + column + i, p0, depth, pairs + i * units);
        else std::fill_n(pairs + i * units, units, 0u);
      }
      uint32_t* out = panel + first;
      int64_t k = 0;
      for (; k + lanes <= units; k += lanes) TransposeBlock(du, pairs + k, units, out + k * tile_cols, tile_cols);
      for (; k < units; ++k)
        for (int64_t i = 0; i < lanes; ++i) out[k * tile_cols + i] = pairs[i * units + k];
    }
  }
}

// The unit rows of a depth block's B panels: its k-pairs, padded to whole tile steps on the AMX tiles.
int64_t PanelUnits(int64_t depth, bool amx) {
  const int64_t units = CeilDiv(depth, 2);
  return amx ? CeilDiv(units, kAmxDepthUnits) * kAmxDepthUnits : units;
}

// op(b) packed whole in pairs (Gemm::b_pairs): each depth block's NR-column panels in column order, as
// PackPairsB packs a block of all the columns, the blocks one after the other. amx: the tiles' padding.
template <class DF>
void PackPairsBWhole(DF df, const Gemm<float>& g, bool amx, uint32_t* HWY_RESTRICT dst) {
  const int64_t tile_cols = kTileVectors * static_cast<int64_t>(hn::Lanes(df));
  const int64_t depth_step = DepthStep<uint32_t, 2>(g.K), panels = CeilDiv(g.N, tile_cols);
  for (int64_t p0 = 0; p0 < g.K; p0 += depth_step) {
    const int64_t depth = std::min(depth_step, g.K - p0), units = PanelUnits(depth, amx);
    PackPairsB(df, g, p0, depth, 0, g.N, units, dst);
    dst += panels * units * tile_cols;
  }
}

// The panels of op(b)[p0 : p0 + depth_step, j0 :] within Gemm::b_pairs (j0 a multiple of tile_cols).
const uint32_t* PackedPairsBlock(const Gemm<float>& g, int64_t p0, int64_t depth_step, int64_t j0, int64_t tile_cols,
                                 bool amx) {
  const int64_t panels = CeilDiv(g.N, tile_cols);
  const int64_t block_units = PanelUnits(std::min(depth_step, g.K - p0), amx);
  return g.b_pairs + (p0 / depth_step) * panels * PanelUnits(depth_step, amx) * tile_cols +
         (j0 / tile_cols) * block_units * tile_cols;
}

// op(a)[i0 : i0 + rows, p0 : p0 + depth] as the AMX tiles read A: rows of pairs [padded_rows][stride],
// row r holding the k-pairs of row i0 + r side by side; the units past depth / 2 and the rows past
// `rows` are zero. stride is a multiple of Lanes.
template <class DF>
void PackPairRowsA(DF df, const Gemm<float>& g, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
                   int64_t padded_rows, int64_t stride, uint32_t* HWY_RESTRICT dst) {
  const hn::RebindToUnsigned<DF> du;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(du));
  const int64_t units = CeilDiv(depth, 2);
  const PairRows a = PairRowsOfA(g);
  std::fill(dst + rows * stride, dst + padded_rows * stride, 0u);
  if (!g.trans_a) {
    // a is [M, K]: a row converted to bf16 is a row of pairs.
    for (int64_t r = 0; r < rows; ++r) {
      a.row(i0 + r, p0, depth, dst + r * stride);
      std::fill(dst + r * stride + units, dst + (r + 1) * stride, 0u);
    }
    return;
  }
  // a is [K, M]: two k-rows of a make a row of unit kp for every row of C; Lanes such rows at a time
  // are transposed, in Lanes x Lanes blocks, into Lanes units of each row.
  const int64_t width = CeilDiv(rows, lanes) * lanes;
  uint32_t* pairs = PairScratch(lanes * width);
  for (int64_t kp0 = 0; kp0 < stride; kp0 += lanes) {
    for (int64_t i = 0; i < lanes; ++i) {
      uint32_t* row = pairs + i * width;
      const int64_t kp = kp0 + i;
      if (kp < units) {
        a.interleave(p0 + 2 * kp, 2 * kp + 1 < depth ? p0 + 2 * kp + 1 : -1, i0, rows, row);
        std::fill(row + rows, row + width, 0u);
      } else {
        std::fill_n(row, width, 0u);
      }
    }
    for (int64_t m0 = 0; m0 < rows; m0 += lanes) {
      if (m0 + lanes <= rows) {
        TransposeBlock(du, pairs + m0, width, dst + m0 * stride + kp0, stride);
        continue;
      }
      for (int64_t m = m0; m < rows; ++m)
        for (int64_t i = 0; i < lanes; ++i) dst[m * stride + kp0 + i] = pairs[i * width + m];
    }
  }
}
#endif  // LT_GEMM_BF16

// tile [MR][NR] = the product of an A micro-panel and a B micro-panel of depth k's, in k order. A's value
// (r, k) is at a_panel[r * a_row + k * a_col] (packed: 1 and MR; read in place: 1 and lda when a is
// transposed, lda and 1 when not); B's NR values of k start at b_panel + k * b_stride (NR when packed,
// ldb when read in place). The accumulators stay in registers for the whole k loop (every loop over rows
// and vectors is unrolled, so every array index is a constant). Not inlined on purpose: with the
// write-back's alpha and beta (scalars that live in vector registers) in the same function, the compiler
// runs out of registers and spills the B vectors inside the loop; the call costs a few cycles per tile.
// Aligned to a cache line, so that its k loop (~900 bytes unrolled) sits in the same place relative to
// the decoder's 64-byte windows whatever code is linked before it: without that, a change elsewhere in
// the binary moved dense-124m's matmuls by 2-6% on the Xeon (Sapphire Rapids), forward ones included.
// kRows < MR: the first kRows rows only (the last tile of a few rows, one decoded row), each element the
// same chain of FMAs as in a full tile.
template <int kRows, class D, class T = hn::TFromD<D>>
HWY_NOINLINE __attribute__((aligned(64))) void AccumulateTile(D d, int64_t depth, const T* HWY_RESTRICT a_panel,
                                                              const int64_t* a_row_offsets, int64_t a_col,
                                                              const T* HWY_RESTRICT b_panel, int64_t b_stride,
                                                              T* HWY_RESTRICT tile) {
  using V = hn::Vec<D>;
  const size_t lanes = hn::Lanes(d);
  int64_t row_offset[kRows];
  for (int r = 0; r < kRows; ++r) row_offset[r] = a_row_offsets[r];
  V acc[kRows][kTileVectors];
  HWY_UNROLL(kTileRows)
  for (int r = 0; r < kRows; ++r) {
    HWY_UNROLL(kTileVectors)
    for (int v = 0; v < kTileVectors; ++v) acc[r][v] = hn::Zero(d);
  }
  // Unrolled by 4 so that the loop overhead amortises over ~100 FMAs.
  HWY_UNROLL(4)
  for (int64_t k = 0; k < depth; ++k) {
    V b[kTileVectors];
    HWY_UNROLL(kTileVectors)
    for (int v = 0; v < kTileVectors; ++v) b[v] = hn::LoadU(d, b_panel + v * lanes);
    HWY_UNROLL(kTileRows)
    for (int r = 0; r < kRows; ++r) {
      const V ar = hn::Set(d, a_panel[row_offset[r]]);
      HWY_UNROLL(kTileVectors)
      for (int v = 0; v < kTileVectors; ++v) acc[r][v] = hn::MulAdd(ar, b[v], acc[r][v]);
    }
    a_panel += a_col;
    b_panel += b_stride;
  }
  HWY_UNROLL(kTileRows)
  for (int r = 0; r < kRows; ++r) {
    HWY_UNROLL(kTileVectors)
    for (int v = 0; v < kTileVectors; ++v) hn::Store(acc[r][v], d, tile + (r * kTileVectors + v) * lanes);
  }
}

// c[r, :] = alpha * tile[r, :] + beta * c[r, :] for the first `rows` rows of a full-width tile (tile rows
// are NR apart), then + addend[r, :] (ldc apart) where there is one. beta == 0 never reads c (it may hold
// garbage, as in BLAS). Each case is a loop of its own, chosen once per tile, so that no vector waits on
// a test, and beta 0 cannot become a read of c and a blend. (With the tests per vector, the AVX2 target's
// moe-s GEMMs measured 1-3% slower than before the addend in 6 of 7 pairs of steps; as four loops, even.)
template <bool kReadC, bool kAddend, class D, class T = hn::TFromD<D>>
HWY_INLINE void WriteRowsOf(D d, const T* HWY_RESTRICT tile, int rows, T* c, int64_t ldc, T alpha, T beta,
                            const T* addend) {
  const size_t lanes = hn::Lanes(d), tile_cols = kTileVectors * lanes;
  const auto va = hn::Set(d, alpha), vb = hn::Set(d, beta);
  for (int r = 0; r < rows; ++r)
    for (size_t col = 0; col < tile_cols; col += lanes) {
      const auto acc = hn::Load(d, tile + r * tile_cols + col);
      T* out = c + r * ldc + col;
      auto v = kReadC ? hn::MulAdd(va, acc, hn::Mul(vb, hn::LoadU(d, out))) : hn::Mul(va, acc);
      if constexpr (kAddend) v = hn::Add(v, hn::LoadU(d, addend + r * ldc + col));
      hn::StoreU(v, d, out);
    }
}
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void WriteRows(D d, const T* HWY_RESTRICT tile, int rows, T* c, int64_t ldc, T alpha, T beta,
                          const T* addend) {
  if (addend) {
    if (beta == T(0)) return WriteRowsOf<false, true>(d, tile, rows, c, ldc, alpha, beta, addend);
    return WriteRowsOf<true, true>(d, tile, rows, c, ldc, alpha, beta, addend);
  }
  if (beta == T(0)) return WriteRowsOf<false, false>(d, tile, rows, c, ldc, alpha, beta, addend);
  WriteRowsOf<true, false>(d, tile, rows, c, ldc, alpha, beta, addend);
}

// The first `rows` rows and `cols` columns of a full-width tile (rows NR apart, any number of them)
// written back to C with alpha and beta. Fewer than NR columns at the edge of C go through a scratch of
// MR rows, so that their arithmetic is exactly that of a full tile.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void WriteTile(D d, const T* HWY_RESTRICT tile, int rows, int cols, T* c, int64_t ldc, T alpha, T beta,
                          const T* addend) {
  const size_t tile_cols = kTileVectors * hn::Lanes(d);
  if (cols == static_cast<int>(tile_cols)) {
    WriteRows(d, tile, rows, c, ldc, alpha, beta, addend);
    return;
  }
  HWY_ALIGN T edge[kTileRows * kTileVectors * HWY_MAX_BYTES / sizeof(T)] = {};
  const size_t row_bytes = static_cast<size_t>(cols) * sizeof(T);
  for (int r0 = 0; r0 < rows; r0 += kTileRows) {
    const int part = std::min(kTileRows, rows - r0);
    T* c_part = c + r0 * ldc;
    if (beta != T(0))
      for (int r = 0; r < part; ++r) std::memcpy(edge + r * tile_cols, c_part + r * ldc, row_bytes);
    WriteRows(d, tile + r0 * tile_cols, part, edge, static_cast<int64_t>(tile_cols), alpha, beta,
              static_cast<const T*>(nullptr));
    for (int r = 0; r < part; ++r) {
      T* c_row = c_part + r * ldc;
      std::memcpy(c_row, edge + r * tile_cols, row_bytes);
      if (addend)
        for (int col = 0; col < cols; ++col) c_row[col] += addend[(r0 + r) * ldc + col];
    }
  }
}

// C is read (beta) and written only after the k loop: fetching it first hides a miss to L3 or DRAM
// behind the tile's products.
template <class T>
HWY_INLINE void PrefetchRows(const T* c, int64_t ldc, int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    for (int col = 0; col < cols; col += static_cast<int>(64 / sizeof(T))) hwy::Prefetch(c + r * ldc + col);
}

// The first `rows` rows of a tile (AccumulateTile).
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void AccumulateRows(D d, int rows, int64_t depth, const T* a_panel, const int64_t* a_row_offsets,
                               int64_t a_col, const T* b_panel, int64_t b_stride, T* tile) {
  static_assert(kTileRows == 6, "one case per row count");
  switch (rows) {
    case 1:
      return AccumulateTile<1>(d, depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile);
    case 2:
      return AccumulateTile<2>(d, depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile);
    case 3:
      return AccumulateTile<3>(d, depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile);
    case 4:
      return AccumulateTile<4>(d, depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile);
    case 5:
      return AccumulateTile<5>(d, depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile);
    default:
      return AccumulateTile<kTileRows>(d, depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile);
  }
}

// One MR x NR tile of C over one KC block, written back with alpha and beta (rows/cols < MR/NR at the
// edges of C). accumulate(depth, a_panel, a_row, a_col, b_panel, b_stride, tile, rows) is the
// micro-kernel: AccumulateRows on T, or accumulate_tile_bf16 on pairs (P, the packed element, is T or
// uint32_t; all MR rows).
template <class D, class P, class Accumulate, class T = hn::TFromD<D>>
HWY_INLINE void MicroKernel(D d, int64_t depth, const P* a_panel, const int64_t* a_row_offsets, int64_t a_col,
                            const P* b_panel, int64_t b_stride, T* c, int64_t ldc, int rows, int cols, T alpha, T beta,
                            const T* addend, Accumulate accumulate) {
  HWY_ALIGN T tile[kTileRows * kTileVectors * HWY_MAX_BYTES / sizeof(T)];
  PrefetchRows(c, ldc, rows, cols);
  if (addend) PrefetchRows(addend, ldc, rows, cols);
  accumulate(depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile, rows);
  WriteTile(d, tile, rows, cols, c, ldc, alpha, beta, addend);
}

// Where the micro-kernel finds one operand's micro-panels in a block: panel p < at_base starts at base +
// p * panel_stride, its k's k_stride apart and (A only; B's NR values of a k are contiguous) its rows
// row_stride apart: packed panels, or the operand read where it lies. An A [M, K] read in place through
// a gather (Gemm::a_rows) has its row r of panel p at base + gathered[p * MR + r] * row_stride instead.
// The panel after them, the partial last one of an operand read in place, is packed at tail, its k's a
// whole tile row (tail_stride) apart.
template <class P>
struct Panels {
  const P* base;
  int64_t k_stride, row_stride, panel_stride, at_base;
  const P* tail;
  int64_t tail_stride;
  const int32_t* gathered = nullptr;
  const P* panel(int64_t p) const { return p >= at_base ? tail : gathered ? base : base + p * panel_stride; }
  int64_t k_step(int64_t p) const { return p < at_base ? k_stride : tail_stride; }
  // The offsets of panel p's MR rows from panel(p).
  void row_offsets(int64_t p, int64_t* offset) const {
    for (int64_t r = 0; r < kTileRows; ++r)
      offset[r] = p >= at_base ? r : gathered ? gathered[p * kTileRows + r] * row_stride : r * row_stride;
  }
};

// C[i0 : i0 + rows, j0 : j0 + cols] over one KC block (depth k rows of the panels), from A's and B's
// panels, the addend joining on the last KC block (with_addend). The A micro-panel is the outer loop so
// that it stays in L1 (packed) or near it while the B panels stream from L2.
//
// An A read in place ([M, K] rows) is not in cache when its first tile starts, and that tile stalls on
// its rows one line at a time: six streams of a few lines each, too short for the hardware prefetcher.
// So while one micro-panel meets the B panels, the lines of the next one are prefetched, a few per tile
// (all of them at once, before the first tile, evicted the current panel's lines and made AVX2 slower).
// Measured on Zen 4 with moe-s's experts (gemm_bench --filter paired, 1 thread), the products that read
// A in place (x W^T, g W): 1.09-1.16x on AVX2, 1.01-1.15x on AVX-512; in a step the grouped GEMMs took
// 0.93-0.95x the time on AVX2, and on AVX-512 within noise.
//
// A b packed whole (Gemm::b_packed) lies in memory, not in a block kept in L2: there the B panel is the
// outer loop instead, so that each is read from memory once and meets the few A micro-panels (at most
// kMaxRowsReusedB rows) while it is in cache.
template <class D, class P, class Accumulate, class T = hn::TFromD<D>>
void MacroKernel(D d, const Gemm<T>& g, int64_t i0, int64_t rows, int64_t j0, int64_t cols, int64_t depth,
                 const Panels<P>& a, const Panels<P>& b, T beta, bool with_addend, Accumulate accumulate) {
  const int64_t tile_cols = kTileVectors * static_cast<int64_t>(hn::Lanes(d));
  if (g.b_packed) {
    int64_t offsets[kTileRows];
    for (int64_t p = 0, c0 = 0; c0 < cols; ++p, c0 += tile_cols) {
      const int tile_width = static_cast<int>(std::min(tile_cols, cols - c0));
      for (int64_t q = 0, r0 = 0; r0 < rows; ++q, r0 += kTileRows) {
        const int tile_rows = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
        const int64_t c_offset = (i0 + r0) * g.ldc + j0 + c0;
        a.row_offsets(q, offsets);
        MicroKernel(d, depth, a.panel(q), offsets, a.k_step(q), b.panel(p), b.k_step(p), g.c + c_offset, g.ldc,
                    tile_rows, tile_width, g.alpha, beta, with_addend ? g.addend + c_offset : nullptr, accumulate);
      }
    }
    return;
  }
  constexpr int64_t kLineElements = 64 / sizeof(P);
  // The next in-place A panel's lines, k-major (the first k's of every row first), spread over the tiles.
  const int64_t next_lines = kTileRows * CeilDiv(depth, kLineElements);
  const int64_t lines_per_tile = CeilDiv(next_lines, CeilDiv(cols, tile_cols));
  int64_t offsets[kTileRows], next_offsets[kTileRows];
  for (int64_t q = 0, r0 = 0; r0 < rows; ++q, r0 += kTileRows) {
    const int tile_rows = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
    T* c_rows = g.c + (i0 + r0) * g.ldc + j0;
    const T* addend_rows = with_addend ? g.addend + (i0 + r0) * g.ldc + j0 : nullptr;
    a.row_offsets(q, offsets);
    const P* next_rows = a.k_step(q) == 1 && q + 1 < a.at_base ? a.panel(q + 1) : nullptr;
    if (next_rows) a.row_offsets(q + 1, next_offsets);
    int64_t line = 0;
    for (int64_t p = 0, c0 = 0; c0 < cols; ++p, c0 += tile_cols) {
      if (next_rows)
        for (const int64_t end = std::min(next_lines, line + lines_per_tile); line < end; ++line)
          hwy::Prefetch(next_rows + next_offsets[line % kTileRows] + (line / kTileRows) * kLineElements);
      const int tile_width = static_cast<int>(std::min(tile_cols, cols - c0));
      MicroKernel(d, depth, a.panel(q), offsets, a.k_step(q), b.panel(p), b.k_step(p), c_rows + c0, g.ldc, tile_rows,
                  tile_width, g.alpha, beta, addend_rows ? addend_rows + c0 : nullptr, accumulate);
    }
  }
}

#if LT_GEMM_BF16
// C[i0 : i0 + rows, j0 : j0 + cols] over one KC block on the AMX tiles, in blocks of 32 rows x 64
// columns: A's rows of pairs (stride units apart) against B's packed panels of 64 columns (padded_units
// rows each). The 32 rows of A (32 KiB at KC) stay in L1 while B's panels stream from L2.
template <class DF>
void AmxMacroKernel(DF df, const Gemm<float>& g, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                    int64_t padded_units, const uint32_t* a_rows, const uint32_t* b_panels, float beta,
                    bool with_addend) {
  static_assert(kAmxBlockColumns == kTileVectors * 16, "one AMX block is one B panel wide");
  HWY_ALIGN float block[kAmxBlockRows * kAmxBlockColumns];
  for (int64_t r0 = 0; r0 < rows; r0 += kAmxBlockRows) {
    const int block_rows = static_cast<int>(std::min(kAmxBlockRows, rows - r0));
    for (int64_t c0 = 0; c0 < cols; c0 += kAmxBlockColumns) {
      const int block_cols = static_cast<int>(std::min(kAmxBlockColumns, cols - c0));
      float* c = g.c + (i0 + r0) * g.ldc + j0 + c0;
      const float* addend = with_addend ? g.addend + (i0 + r0) * g.ldc + j0 + c0 : nullptr;
      PrefetchRows(c, g.ldc, block_rows, block_cols);
      amx_block(padded_units, a_rows + r0 * padded_units, padded_units, b_panels + c0 * padded_units, block);
      WriteTile(df, block, block_rows, block_cols, c, g.ldc, g.alpha, beta, addend);
    }
  }
}
#endif

// The blocked GEMM of C[m0:m1, n0:n1], run by one thread with its own packing buffers; kPairs: the bf16
// panel path (T = float).
template <class T, bool kPairs>
void GemmBlock(const Gemm<T>& g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  using P = std::conditional_t<kPairs, uint32_t, T>;
  const hn::ScalableTag<T> d;
  const int64_t tile_cols = kTileVectors * static_cast<int64_t>(hn::Lanes(d));
  const int64_t k_per_unit = kPairs ? 2 : 1;
  const int64_t depth_step = DepthStep<P, kPairs ? 2 : 1>(g.K);
  // K = 0 still makes one (empty) block: C = beta C.
  const int64_t depth_blocks = std::max<int64_t>(1, CeilDiv(g.K, depth_step));
  static const int64_t column_block_bytes = gemm_column_block_bytes(cpu_l2_cache_bytes());
  const int64_t column_block = std::max(tile_cols, column_block_bytes / int64_t(sizeof(P)) / tile_cols * tile_cols);
  const bool narrow = n1 - n0 <= kNarrowColumns;
  // A gathered b is packed: the micro-kernel steps from one k of b to the next by a constant stride.
  const bool b_in_place =
      !kPairs && !g.trans_b && !g.b_rows && (g.M <= kFewRows || (narrow && m1 - m0 <= kMaxRowsUnpackedB));
  // A read in place: the micro-kernel broadcasts its values from where they lie, and only a partial last
  // panel is packed. A transposed a [K, M] holds a micro-panel's MR values of one k side by side, lda
  // apart per k; a [M, K] holds MR rows of contiguous k's. A transposed a costs a cache line per k, which
  // the AVX-512 tile's 24 FMAs per k hide but the 12 of the narrower tiles do not: on the AVX2 target
  // (Zen 4 restricted to it) it ran the weight gradients' shapes at 0.76x, so there it is packed; so is
  // one whose k's lie pages apart (kPageBytes), and one gathered by k (a row of a per k). A gathered
  // a [M, K] is read in place through the row offsets the micro-kernel takes anyway.
  const bool a_pages_apart = g.trans_a && g.lda * static_cast<int64_t>(sizeof(T)) > kPageBytes;
  const bool a_in_place = !kPairs && narrow && (!g.trans_a || (kTileVectors >= 4 && !a_pages_apart && !g.a_rows));
  const bool a_packed_for_stride = !kPairs && narrow && kTileVectors >= 4 && a_pages_apart;
  const int64_t row_block = (a_packed_for_stride ? kFarApartRowBlock : kRowBlock) / kTileRows * kTileRows;
  // The bf16 pairs on AMX tiles: A as rows of pairs, both operands' depth padded to whole tile steps.
  const bool amx = kPairs && amx_tiles() != AmxTiles::Off;
  const AmxTileScope tiles_in_use(amx);

  // A thread's packing buffers are the largest that any block needs (an MC x KC block of A, a KC x NC
  // block of B: 2 MiB and 1 MiB in f32), whatever this GEMM's shape: the shapes a thread meets depend on
  // which work it takes over from the other threads, and the experts' weight gradients have K = their
  // segment's rows, which change from step to step. Sized by the GEMM, a buffer could grow in any step
  // (a system allocation in the steady state).
  const int64_t block_units = kDepthBlockBytes / int64_t(sizeof(P));
  const int64_t buffer_units = amx ? CeilDiv(block_units, kAmxDepthUnits) * kAmxDepthUnits : block_units;
  const int64_t buffer_rows = amx ? CeilDiv(kRowBlock, kAmxBlockRows) * kAmxBlockRows : kRowBlock;
  P* a_packed = PackBuffer<P, 0>(buffer_rows * buffer_units);
  P* b_packed = PackBuffer<P, 1>(CeilDiv(column_block, tile_cols) * tile_cols * buffer_units);
  // Pairs are always packed, so their A panels are always kTileRows units per k.
  const auto accumulate = [d](int64_t depth, const P* a_panel, [[maybe_unused]] const int64_t* a_row_offsets,
                              [[maybe_unused]] int64_t a_col, const P* b_panel, int64_t b_stride, T* tile,
                              [[maybe_unused]] int rows) {
#if LT_GEMM_BF16
    if constexpr (kPairs) return accumulate_tile_bf16(depth, a_panel, b_panel, b_stride, tile);
#endif
    if constexpr (!kPairs) AccumulateRows(d, rows, depth, a_panel, a_row_offsets, a_col, b_panel, b_stride, tile);
  };

  for (int64_t p0 = 0, block = 0; block < depth_blocks; ++block, p0 += depth_step) {
    const int64_t depth = std::min(depth_step, g.K - p0), units = CeilDiv(depth, k_per_unit);
    const T beta = block == 0 ? g.beta : T(1);
    const bool with_addend = g.addend != nullptr && block + 1 == depth_blocks;
#if LT_GEMM_BF16
    if constexpr (kPairs)
      if (amx) {
        const int64_t padded_units = CeilDiv(units, kAmxDepthUnits) * kAmxDepthUnits;
        for (int64_t i0 = m0; i0 < m1; i0 += row_block) {
          const int64_t rows = std::min(row_block, m1 - i0);
          PackPairRowsA(d, g, i0, rows, p0, depth, CeilDiv(rows, kAmxBlockRows) * kAmxBlockRows, padded_units,
                        a_packed);
          for (int64_t j0 = n0; j0 < n1; j0 += column_block) {
            const int64_t cols = std::min(column_block, n1 - j0);
            const uint32_t* b_block = b_packed;
            if (g.b_pairs) b_block = PackedPairsBlock(g, p0, depth_step, j0, tile_cols, true);
            else PackPairsB(d, g, p0, depth, j0, cols, padded_units, b_packed);
            AmxMacroKernel(d, g, i0, rows, j0, cols, padded_units, a_packed, b_block, beta, with_addend);
          }
        }
        continue;
      }
#endif
    for (int64_t i0 = m0; i0 < m1; i0 += row_block) {
      const int64_t rows = std::min(row_block, m1 - i0);
      Panels<P> a_panels{a_packed, kTileRows, 1, kTileRows * units, CeilDiv(rows, kTileRows), a_packed, kTileRows};
      if constexpr (kPairs) {
#if LT_GEMM_BF16
        PackPairsA(d, g, i0, rows, p0, depth, a_packed);
#endif
      } else if (a_in_place) {
        const int64_t full_panels = rows / kTileRows;
        if (rows % kTileRows) PackA(d, g, i0 + full_panels * kTileRows, rows % kTileRows, p0, depth, a_packed);
        if (g.trans_a)
          a_panels = Panels<P>{g.a + p0 * g.lda + i0, g.lda, 1, kTileRows, full_panels, a_packed, kTileRows};
        else if (g.a_rows)
          a_panels = Panels<P>{g.a + p0, 1, g.lda, 0, full_panels, a_packed, kTileRows, g.a_rows + i0};
        else
          a_panels = Panels<P>{g.a + i0 * g.lda + p0, 1, g.lda, kTileRows * g.lda, full_panels, a_packed, kTileRows};
      } else {
        PackA(d, g, i0, rows, p0, depth, a_packed);
      }
      for (int64_t j0 = n0; j0 < n1; j0 += column_block) {
        const int64_t cols = std::min(column_block, n1 - j0);
        Panels<P> b_panels{b_packed, tile_cols, 1, units * tile_cols, CeilDiv(cols, tile_cols), b_packed, tile_cols};
        if constexpr (kPairs) {
#if LT_GEMM_BF16
          if (g.b_pairs) b_panels.base = PackedPairsBlock(g, p0, depth_step, j0, tile_cols, false);
          else PackPairsB(d, g, p0, depth, j0, cols, units, b_packed);
#endif
        } else if (b_in_place) {
          const int64_t full_panels = cols / tile_cols;
          if (cols % tile_cols) PackB(d, g, p0, depth, j0 + full_panels * tile_cols, cols % tile_cols, b_packed);
          b_panels = {g.b + p0 * g.ldb + j0, g.ldb, 1, tile_cols, full_panels, b_packed, tile_cols};
        } else if (g.b_packed) {  // this block's panels within the whole packing (ReusedPackedB's layout)
          const T* block_panels = g.b_packed + p0 * CeilDiv(g.N, tile_cols) * tile_cols + j0 * depth;
          b_panels = {block_panels, tile_cols, 1, depth * tile_cols, CeilDiv(cols, tile_cols), b_packed, tile_cols};
        } else {
          PackB(d, g, p0, depth, j0, cols, b_packed);
        }
        MacroKernel(d, g, i0, rows, j0, cols, units, a_panels, b_panels, beta, with_addend, accumulate);
      }
    }
  }
}

// Dot products for few rows against a transposed b [N, K]: C[i0 + r, j] for r < kRows and j in [n0, n1),
// each a dot product of two rows contiguous in k, summed in Lanes partial sums (k in steps of Lanes),
// reduced across lanes, then the k's of the last partial vector added in order. Tiles of kRows x
// kColumns accumulators, kRows x kColumns = kDotAccumulators: enough independent FMA chains to cover
// the FMA latency even for one row (a single chain per element would wait 4 cycles per FMA), with
// each loaded vector of a feeding kColumns FMAs and each of b kRows. AVX-512 has registers for 16
// accumulators plus the loads; the targets with 16 registers for 8.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kDotAccumulators = 16;
#else
constexpr int kDotAccumulators = 8;
#endif
constexpr int kDotRows = kDotAccumulators / 4;

template <int kRows, class D, class T = hn::TFromD<D>>
HWY_NOINLINE void DotRows(D d, const Gemm<T>& g, const T* a_copy, int64_t i0, int64_t n0, int64_t n1) {
  constexpr int kColumns = kDotAccumulators / kRows;
  using V = hn::Vec<D>;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t vector_depth = g.K / lanes * lanes;
  const T* a_row[kRows];
  for (int r = 0; r < kRows; ++r) a_row[r] = a_copy ? a_copy + (i0 + r) * g.K : RowOfA(g, i0 + r);
  for (int64_t j0 = n0; j0 < n1; j0 += kColumns) {
    // A partial tile repeats its last column, so every load stays inside b; the copies are not stored.
    const T* b_rows[kColumns];
    for (int col = 0; col < kColumns; ++col) b_rows[col] = g.b + std::min(j0 + col, n1 - 1) * g.ldb;
    V acc[kRows][kColumns];
    HWY_UNROLL(kDotAccumulators)
    for (int r = 0; r < kRows; ++r) {
      HWY_UNROLL(kDotAccumulators)
      for (int col = 0; col < kColumns; ++col) acc[r][col] = hn::Zero(d);
    }
    for (int64_t k = 0; k < vector_depth; k += lanes) {
      V va[kRows];
      HWY_UNROLL(kDotAccumulators)
      for (int r = 0; r < kRows; ++r) va[r] = hn::LoadU(d, a_row[r] + k);
      HWY_UNROLL(kDotAccumulators)
      for (int col = 0; col < kColumns; ++col) {
        const V vb = hn::LoadU(d, b_rows[col] + k);
        HWY_UNROLL(kDotAccumulators)
        for (int r = 0; r < kRows; ++r) acc[r][col] = hn::MulAdd(va[r], vb, acc[r][col]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      T* c_row = g.c + (i0 + r) * g.ldc;
      for (int col = 0; col < kColumns && j0 + col < n1; ++col) {
        T sum = hn::GetLane(hn::SumOfLanes(d, acc[r][col]));
        for (int64_t k = vector_depth; k < g.K; ++k) sum += a_row[r][k] * b_rows[col][k];
        T& out = c_row[j0 + col];
        out = g.beta == T(0) ? g.alpha * sum : g.alpha * sum + g.beta * out;
        if (g.addend) out += g.addend[(i0 + r) * g.ldc + j0 + col];
      }
    }
  }
}

// C[:, n0:n1] for few rows against a transposed b; op(a)'s rows are a's own (through the gather), or
// those of a_copy, K apart. Columns go in chunks so that a chunk of b (kDotChunk rows of b, 64 KiB for
// K = 256) stays in L2 while every row group passes over it.
template <class T>
void GemmDotRows(const Gemm<T>& g, const T* a_copy, int64_t n0, int64_t n1) {
  constexpr int64_t kDotChunk = 64;
  const hn::ScalableTag<T> d;
  for (int64_t j0 = n0; j0 < n1; j0 += kDotChunk) {
    const int64_t j1 = std::min(n1, j0 + kDotChunk);
    for (int64_t i0 = 0; i0 < g.M; i0 += kDotRows) {
      switch (std::min<int64_t>(kDotRows, g.M - i0)) {
        case 4:
          DotRows<4>(d, g, a_copy, i0, j0, j1);
          break;
        case 3:
          DotRows<3>(d, g, a_copy, i0, j0, j1);
          break;
        case 2:
          DotRows<2>(d, g, a_copy, i0, j0, j1);
          break;
        default:
          DotRows<1>(d, g, a_copy, i0, j0, j1);
          break;
      }
    }
  }
}

// The dot-product path (few rows against a transposed b): threads split the columns of C. Each element
// is computed the same way whichever tile or thread it falls in.
template <class T>
void GemmDot(const Gemm<T>& g) {
  struct Job {
    const Gemm<T>* g;
    const T* a_copy;
  } job{&g, nullptr};
  if (g.trans_a) {  // rows of a [K, M] are gathered once, so both operands are read contiguously
    T* gathered = PackBuffer<T, 0>(g.M * g.K);
    for (int64_t k = 0; k < g.K; ++k)
      for (int64_t i = 0; i < g.M; ++i) gathered[i * g.K + k] = RowOfA(g, k)[i];
    job.a_copy = gathered;
  }
  const double column_flops = 2.0 * static_cast<double>(g.M) * static_cast<double>(g.K + 1);
  const int64_t grain = grain_for_flops(column_flops);
  // Capturing one reference keeps the closure inside std::function's small buffer: no allocation.
  parallel_for(g.N, grain, [&job](int64_t begin, int64_t end) { GemmDotRows(*job.g, job.a_copy, begin, end); });
}

// Whether this target multiplies bf16 pairs on this CPU.
bool Bf16GemmAvailable() {
#if LT_GEMM_BF16
  return has_bf16_dot();
#else
  return false;
#endif
}

// GemmBlock in f32/f64, or in bf16 pairs (instantiated only where the target has them).
template <class T>
void GemmBlockOf(const Gemm<T>& g, [[maybe_unused]] bool pairs, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
#if LT_GEMM_BF16
  if constexpr (std::is_same_v<T, float>)
    if (pairs) return GemmBlock<T, true>(g, m0, m1, n0, n1);
#endif
  GemmBlock<T, false>(g, m0, m1, n0, n1);
}

// Whether the calling thread's ReusedMatmulOperands scope holds b (not gathered, K > 0).
template <class T>
bool HeldConstant(const Gemm<T>& g) {
  const ReusedOperands* reused = reused_operands;
  if (reused == nullptr || g.b_rows || g.K == 0 || g.N == 0) return false;
  const int64_t extent = g.trans_b ? (g.N - 1) * g.ldb + g.K : (g.K - 1) * g.ldb + g.N;
  return reused->holds(g.b, extent * int64_t(sizeof(T)));
}

// op(b) packed whole for the panel path when the calling thread's ReusedMatmulOperands scope holds b
// (nullptr otherwise, and at its first use): packed at the second use, then found. Per KC block
// (DepthStep) all of its NR-column panels in column order, the block at p0 starting at p0 x N rounded up
// to whole panels: the panels PackB writes for any block of columns, so the product has the bits of
// packing as it goes.
template <class T>
const T* ReusedPackedB(const Gemm<T>& g, int64_t tile_cols) {
  if (!HeldConstant(g)) return nullptr;
  ReusedOperands* reused = reused_operands;
  const ReusedOperands::Key key{g.b, g.K, g.N, g.ldb, g.trans_b, sizeof(T), tile_cols};
  for (const ReusedOperands::Packed& p : reused->packed)
    if (p.key == key) return reinterpret_cast<const T*>(p.panels.get());
  const auto seen = std::find(reused->seen_once.begin(), reused->seen_once.end(), key);
  if (seen == reused->seen_once.end()) {
    reused->seen_once.push_back(key);
    return nullptr;
  }
  reused->seen_once.erase(seen);
  const int64_t padded_cols = CeilDiv(g.N, tile_cols) * tile_cols;
  auto panels = hwy::AllocateAligned<uint8_t>(static_cast<size_t>(g.K * padded_cols) * sizeof(T));
  T* whole = reinterpret_cast<T*>(panels.get());
  const int64_t depth_step = DepthStep<T, 1>(g.K);
  for (int64_t p0 = 0; p0 < g.K; p0 += depth_step)
    PackB(hn::ScalableTag<T>(), g, p0, std::min(depth_step, g.K - p0), 0, g.N, whole + p0 * padded_cols);
  reused->packed.push_back({key, std::move(panels)});
  return whole;
}

// The panel path: threads split C into slabs of whole tiles, along N when N > M (each thread then packs
// all of A, the smaller operand, and its own part of B) and along M otherwise. At N = M the operands are
// the same size, and a slab of all the columns lets each A micro-panel meet twice the B panels: on Zen 4,
// 2 threads, the square shapes ran 1.02-1.18x faster split along M (AVX-512 and AVX2), NormHead's
// 256 x 256 x 4096 chunk of dh = g W 1.05x. Every thread runs the same K blocking, so how C is split
// changes nothing in the result.
template <class T>
void GemmPanels(const Gemm<T>& g) {
  const hn::ScalableTag<T> d;
  const int64_t tile_cols = kTileVectors * static_cast<int64_t>(hn::Lanes(d));
  const int64_t row_panels = CeilDiv(g.M, kTileRows), col_panels = CeilDiv(g.N, tile_cols);
  const int64_t threads = num_threads();
  // bf16 from two row panels on: with fewer rows the product is bound by reading b, and converting b to
  // bf16 pairs would cost more than the FMAs it saves.
  const bool pairs = g.bf16_inputs && g.M > kFewRows;
  bool split_cols = g.N > g.M;
  if (split_cols && col_panels < threads && row_panels > col_panels) split_cols = false;
  if (!split_cols && row_panels < threads && col_panels > row_panels) split_cols = true;
  // A bf16 FLOP takes half the time of an f32 one, and a quarter on AMX tiles (packing included: 3.6-5.2x
  // the f32 GEMM's rate on 1 thread): a chunk needs that many more of them. On the Sapphire Rapids-class
  // Xeon a bf16 moe-s step ran 1.03-1.10x faster with a quarter than with an eighth, as fast as with half.
  const double flop_cost = !pairs ? 1.0 : amx_tiles() == AmxTiles::Hardware ? 0.25 : 0.5;
  const double panel_flops = flop_cost * 2.0 * static_cast<double>(g.K + 1) *
                             static_cast<double>(split_cols ? tile_cols * g.M : kTileRows * g.N);
  const int64_t grain = grain_for_flops(panel_flops);
  Gemm<T> with_packed_b = g;
  if (!pairs && g.M <= kMaxRowsReusedB) with_packed_b.b_packed = ReusedPackedB(g, tile_cols);
  const struct Job {
    const Gemm<T>* g;
    bool split_cols, pairs;
    int64_t tile_cols;
  } job{&with_packed_b, split_cols, pairs, tile_cols};
  parallel_for_slabs(split_cols ? col_panels : row_panels, grain, [&job](int64_t begin, int64_t end) {
    const Gemm<T>& gemm = *job.g;
    if (job.split_cols)
      GemmBlockOf(gemm, job.pairs, 0, gemm.M, begin * job.tile_cols, std::min(gemm.N, end * job.tile_cols));
    else
      GemmBlockOf(gemm, job.pairs, begin * kTileRows, std::min(gemm.M, end * kTileRows), 0, gemm.N);
  });
}

// Few columns of C against many rows (the router's logits x W^T: N = 16 experts on moe-s, 32 on moe-m):
// a tile is kTileVectors vectors wide (64 floats on AVX-512), so at N = 16 three quarters of its FMAs
// would go to padding columns (the router's forward ran at 23% of the peak). The transpose, C^T =
// op(b)^T op(a)^T, has N rows (in panels of kTileRows: 16 rows use 89% of 18) and M columns. Each of its
// elements is the same FMA chain over k with the two factors of each product swapped, so C has the same
// bits. More than kFewRows columns, so that the bf16 contract (pairs from kFewRows + 1 rows on) is the
// same either way, and at most three quarters of a tile. Not for gathered operands (a gathered a would
// become a transposed b gathered by column, which the packing does not read).
template <class T>
bool FewColumnsGoTransposed(const Gemm<T>& g) {
  const int64_t tile_cols = kTileVectors * static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>()));
  return g.N > kFewRows && 4 * g.N <= 3 * tile_cols && g.M >= 2 * tile_cols && !g.a_rows && !g.b_rows;
}

// C^T in a per-thread buffer (kWhich 3): C transposed into it first when beta reads it, the product
// transposed back after. Both transposes are copies, M x N elements against M x N x K FMAs.
template <class T>
void GemmTransposed(const Gemm<T>& g) {
  T* c_t = PackBuffer<T, 3>(g.M * g.N);
  if (g.beta != T(0)) TransposeMatrix(g.c, g.ldc, g.M, g.N, c_t, g.M);
  Gemm<T> transposed{g.N, g.M, g.K, g.b, g.ldb, !g.trans_b, g.a, g.lda, !g.trans_a, c_t, g.M, g.alpha, g.beta,
                     g.bf16_inputs};
  transposed.a_bf16 = g.b_bf16;
  transposed.b_bf16 = g.a_bf16;
  GemmPanels(transposed);
  TransposeMatrix(c_t, g.M, g.N, g.M, g.c, g.ldc);
  if (g.addend)
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.N; ++j) g.c[i * g.ldc + j] += g.addend[i * g.ldc + j];
}

// g with its bf16 operands widened to f32 (exact: the values are bf16's), compact and their gathers
// applied, in per-thread buffers (kWhich 4 and 5), for the paths that read f32: few rows of C, or a CPU
// without the bf16 GEMM.
Gemm<float> WithF32Operands(const Gemm<float>& g) {
  const auto widen = [](const uint16_t* src, const int32_t* gathered, int64_t ld, int64_t rows, int64_t cols,
                        float* dst) {
    for (int64_t i = 0; i < rows; ++i) WidenRowFromBf16(src + (gathered ? gathered[i] : i) * ld, cols, dst + i * cols);
  };
  Gemm<float> w = g;
  if (g.a_bf16) {
    const int64_t rows = g.trans_a ? g.K : g.M, cols = g.trans_a ? g.M : g.K;
    float* a = PackBuffer<float, 4>(rows * cols);
    widen(g.a_bf16, g.a_rows, g.lda, rows, cols, a);
    w.a = a, w.lda = cols, w.a_rows = nullptr, w.a_bf16 = nullptr;
  }
  if (g.b_bf16) {
    const int64_t rows = g.trans_b ? g.N : g.K, cols = g.trans_b ? g.K : g.N;
    float* b = PackBuffer<float, 5>(rows * cols);
    widen(g.b_bf16, g.b_rows, g.ldb, rows, cols, b);
    w.b = b, w.ldb = cols, w.b_rows = nullptr, w.b_bf16 = nullptr;
  }
  return w;
}

template <class T>
void GemmT(const Gemm<T>& g) {
  // Pairs are multiplied from kFewRows + 1 rows of C on (GemmPanels; a C of few columns goes transposed
  // only with many rows), and only those read bf16 operands as they are.
  if constexpr (std::is_same_v<T, float>)
    if ((g.a_bf16 || g.b_bf16) && !(g.bf16_inputs && g.M > kFewRows)) return GemmT(WithF32Operands(g));
  if (g.M <= kMaxRowsReusedB && HeldConstant(g))
    GemmPanels(g);
  else if (g.trans_b && g.M <= kMaxRowsDot)
    GemmDot(g);
  else if (FewColumnsGoTransposed(g))
    GemmTransposed(g);
  else
    GemmPanels(g);
}

void GemmKernel(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const void* a,
                const int32_t* a_rows, const void* b, const int32_t* b_rows, double beta, void* c, const void* addend,
                bool bf16_inputs, const uint32_t* b_pairs, const uint16_t* a_bf16, const uint16_t* b_bf16) {
  LT_FLOAT_SWITCH(dtype, T, {
    Gemm<T> g{M, N, K, static_cast<const T*>(a), trans_a ? M : K, trans_a, static_cast<const T*>(b), trans_b ? K : N,
              trans_b, static_cast<T*>(c), N, T(alpha), T(beta),
              bf16_inputs && std::is_same_v<T, float> && Bf16GemmAvailable(), a_rows, b_rows,
              static_cast<const T*>(addend)};
    if (g.bf16_inputs) g.b_pairs = b_pairs;
    if constexpr (std::is_same_v<T, float>) {
      g.a_bf16 = a_bf16;
      g.b_bf16 = b_bf16;
    }
    GemmT<T>(g);
  });
}

// The units of op(b) [K, N] packed whole in pairs (PackPairsBWhole) with the tiles now in use; 0 where
// this target or CPU has no bf16 GEMM.
int64_t PackedPairsBUnits(int64_t K, int64_t N) {
#if LT_GEMM_BF16
  if (!Bf16GemmAvailable()) return 0;
  const bool amx = amx_tiles() != AmxTiles::Off;
  const int64_t tile_cols = kTileVectors * static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const int64_t depth_step = DepthStep<uint32_t, 2>(K);
  int64_t units = 0;
  for (int64_t p0 = 0; p0 < K; p0 += depth_step) units += PanelUnits(std::min(depth_step, K - p0), amx);
  return units * CeilDiv(N, tile_cols) * tile_cols;
#else
  (void)K;
  (void)N;
  return 0;
#endif
}

void PackPairsBKernel(bool trans_b, int64_t K, int64_t N, const float* b, uint32_t* dst) {
#if LT_GEMM_BF16
  Gemm<float> g{};
  g.K = K;
  g.N = N;
  g.b = b;
  g.ldb = trans_b ? K : N;
  g.trans_b = trans_b;
  PackPairsBWhole(hn::ScalableTag<float>(), g, amx_tiles() != AmxTiles::Off, dst);
#else
  (void)trans_b, (void)K, (void)N, (void)b, (void)dst;
#endif
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(GemmKernel);
HWY_EXPORT(Bf16GemmAvailable);
HWY_EXPORT(PackedPairsBUnits);
HWY_EXPORT(PackPairsBKernel);

bool bf16_matmul_available() { return HWY_DYNAMIC_DISPATCH(Bf16GemmAvailable)(); }

ReusedOperands* begin_reused_operands(std::vector<Tensor> constants) {
  auto* operands = new ReusedOperands{std::move(constants), {}, {}, reused_operands};
  reused_operands = operands;
  return operands;
}

void end_reused_operands(ReusedOperands* operands) {
  LT_CHECK(reused_operands == operands, "reused matmul operands: scopes must end in reverse order, on their thread");
  reused_operands = operands->outer;
  delete operands;
}

int64_t gemm_column_block_bytes(int64_t l2_bytes) {
  // A block of KC x NC floats is kDepthBlockBytes / 4 x NC x 4 bytes; at least 256 columns.
  return std::clamp<int64_t>(l2_bytes * int64_t(sizeof(float)) / kDepthBlockBytes, 1024, kMaxColumnBlockBytes);
}

namespace {
// An operand's data for GemmKernel: f32 or f64, or bf16 (a kept activation, Gemm::a_bf16).
const void* float_data(const Tensor& t) { return t.dtype() == DType::BF16 ? nullptr : t.raw_data(); }
const uint16_t* bf16_data(const Tensor& t) { return t.dtype() == DType::BF16 ? t.bf16_data() : nullptr; }
}  // namespace

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision, const Tensor& addend) {
  const bool bf16_inputs = precision == MatmulPrecision::BF16Inputs;
  const bool batched = a.ndim() == 3;
  const int64_t G = batched ? a.dim(0) : 1;
  const int64_t M = trans_a ? a.dim(-1) : a.dim(-2);
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t N = trans_b ? b.dim(-2) : b.dim(-1);
  const auto gemm = HWY_DYNAMIC_DISPATCH(GemmKernel);
  const size_t elem = dtype_size(c.dtype());
  const auto* pa = static_cast<const char*>(float_data(a));
  const auto* pb = static_cast<const char*>(float_data(b));
  const uint16_t* a16 = bf16_data(a);
  const uint16_t* b16 = bf16_data(b);
  char* pc = static_cast<char*>(c.raw_data());
  const char* pd = addend.defined() ? static_cast<const char*>(addend.raw_data()) : nullptr;
  if (batched && b.ndim() == 2 && !trans_a) {  // one tall GEMM: [G*M, K] @ op(b)
    gemm(c.dtype(), false, trans_b, G * M, N, K, alpha, pa, nullptr, pb, nullptr, beta, pc, pd, bf16_inputs, nullptr,
         a16, b16);
    return;
  }
  const bool b_batched = b.ndim() == 3;
  // Batch g's operands, at its offset in elements of whichever dtype each has.
  const auto at = [](const auto* p, int64_t elements, size_t size) { return p ? p + elements * size : p; };
  for (int64_t g = 0; g < G; ++g)
    gemm(c.dtype(), trans_a, trans_b, M, N, K, alpha, at(pa, g * M * K, elem), nullptr,
         at(pb, b_batched ? g * K * N : 0, elem), nullptr, beta, pc + g * M * N * elem,
         pd ? pd + g * M * N * elem : nullptr, bf16_inputs, nullptr, at(a16, g * M * K, 1),
         at(b16, b_batched ? g * K * N : 0, 1));
}

Tensor pack_b_pairs(const Tensor& b, bool trans_b) {
  LT_CHECK(b.ndim() == 2 && b.dtype() == DType::F32, "pack_b_pairs: b must be a 2-D f32 tensor, got ", b.str());
  const int64_t K = trans_b ? b.dim(1) : b.dim(0), N = trans_b ? b.dim(0) : b.dim(1);
  const int64_t units = HWY_DYNAMIC_DISPATCH(PackedPairsBUnits)(K, N);
  if (units == 0) return Tensor();
  Tensor packed = Tensor::empty({units}, DType::I32);
  HWY_DYNAMIC_DISPATCH(PackPairsBKernel)
  (trans_b, K, N, b.data<float>(), reinterpret_cast<uint32_t*>(packed.data<int32_t>()));
  return packed;
}

void matmul_gathered(const Tensor& a, const Tensor& a_rows, bool trans_a, const Tensor& b, const Tensor& b_rows,
                     bool trans_b, Tensor& c, double alpha, double beta, MatmulPrecision precision,
                     const Tensor& b_pairs) {
  const auto rows_of = [](const Tensor& m, const Tensor& rows) { return rows.defined() ? rows.numel() : m.dim(0); };
  const int64_t M = trans_a ? a.dim(1) : rows_of(a, a_rows);
  const int64_t K = trans_a ? rows_of(a, a_rows) : a.dim(1);
  const int64_t N = trans_b ? b.dim(0) : b.dim(1);
  LT_CHECK(a.ndim() == 2 && b.ndim() == 2 && (!trans_b || !b_rows.defined()) && c.dim(0) == M && c.dim(1) == N &&
               (trans_b ? b.dim(1) : rows_of(b, b_rows)) == K,
           "matmul_gathered: a ", a.str(), ", b ", b.str(), " and c ", c.str(), " do not fit");
  const auto rows_data = [](const Tensor& rows) { return rows.defined() ? rows.data<int32_t>() : nullptr; };
  const auto gemm = HWY_DYNAMIC_DISPATCH(GemmKernel);
  LT_CHECK(!b_pairs.defined() || !b_rows.defined(), "matmul_gathered: a packed b is not gathered");
  const auto* pairs = b_pairs.defined() ? reinterpret_cast<const uint32_t*>(b_pairs.data<int32_t>()) : nullptr;
  const bool bf16_inputs = precision == MatmulPrecision::BF16Inputs;
  gemm(c.dtype(), trans_a, trans_b, M, N, K, alpha, float_data(a), rows_data(a_rows), float_data(b), rows_data(b_rows),
       beta, c.raw_data(), nullptr, bf16_inputs, pairs, bf16_data(a), bf16_data(b));
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
