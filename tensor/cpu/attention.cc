// Causal grouped-query attention, flash-style: forward and backward.
//
// Layout [B, T, H, D] row-major: the row of (b, t, h) starts at ((b * T + t) * H + h) * D, so the rows
// of one head are H * D apart. Query head h reads kv head h / (Hq / Hkv).
//
// Forward: one task per (batch, query head, block of kBlock query rows) streams over the key blocks up
// to the diagonal. Per query row it keeps the running maximum m of the scores seen so far and the sum l
// of exp(s - m) (the online softmax); when a new block raises m, the sum and the output accumulator are
// rescaled by exp(m_old - m_new). Only a kBlock x kBlock tile of scores exists at any time, never the
// T x T matrix. out = acc / l, and lse = m + log(l) is kept for the backward.
//
// Backward (FlashAttention-2): the probabilities are recomputed from lse, P = exp(s - lse), and with
// D_i = rowsum(dout_i * out_i):
//   dv += P^T dout,   dP = dout v^T,   dS = P * (dP - D_i),   dq += scale dS k,   dk += scale dS^T q.
// Determinism: one task per (batch, kv head) owns dk and dv of that kv head and dq of every query head
// that reads it, and adds into them in a fixed order (dk, dv of a key block: query head, then query
// block; dq of a query block: key block). No element is written by two tasks and there are no atomics,
// so the gradients are bit-identical run after run and do not even depend on the thread count. The
// price is parallelism limited to B * Hkv tasks. A task packs its kv head once for the whole sequence
// and walks (query head, query block, key block), so each query block is gathered once.
//
// The block products are small GEMMs vectorised along the rows of their right operand (BlockGemm). Its
// left operand is read through two strides, so a transposed P or dS costs nothing. The right operands
// are gathered into contiguous blocks first (rows of one head in [B, T, H, D] sit H * D apart, which maps
// them to few cache sets when H * D is a large power of two); k, which the score product needs as
// [D, keys], is packed transposed (in Lanes x Lanes register blocks), once per call in the forward and
// once per task in the backward. On the diagonal blocks each product skips the half that the causal
// mask makes zero (Causal).
//
// Document mask (packed sequences): with doc_start, query t of batch row b sees keys doc_start[b, t] .. t
// only, so several documents packed into one row never attend to each other. In the forward and the
// backward, a query block starts from the key block holding its first row's document start (the starts
// never decrease along a row). Within a tile, each row's visible keys are a range [lo, hi): the lanes
// outside it are masked as the keys past the diagonal are. Without doc_start every range starts at 0
// and nothing else changes.
//
// Fused QKV projection (qkv_attention): q, k and v can be the column blocks of the projection [B, T,
// (Hq + 2 Hkv) D], their rows a whole projection row apart (q_ld, kv_ld), with q and k still to be
// turned by RoPE. The kernels turn each row as they gather it into a block (rope-inl.h, the arithmetic
// of the separate RoPE pass), and the backward writes dq, dk and dv into the projection's gradient,
// turned back as they leave their buffers, so neither direction makes a pass over memory for the split.
// The bits are those of the split followed by attention.
//
// Numerics: scores, running max and sums are kept in the tensor's dtype (f32 in training), as
// FlashAttention does; exp sees only scores minus their row maximum (or their logsumexp), never above
// 0, and is ExpNonPositive (tensor/cpu/exp-inl.h: about 1 ulp, in ~60% of hn::Exp's instructions).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/attention.cc"
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/amx.h"
#include "tensor/cpu/bf16-inl.h"
#include "tensor/cpu/bf16_dot.h"
#include "tensor/cpu/exp-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/rope-inl.h"
#include "tensor/cpu/transpose-inl.h"
#include "tensor/dtype_switch.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

#ifndef LINGTRAIN_ATTENTION_SHAPE  // once, outside the per-target namespaces: the dispatched kernels take it
#define LINGTRAIN_ATTENTION_SHAPE
namespace lt::cpu {
struct AttentionShape {
  int64_t B, T, Hq, Hkv, D;
  // Elements from one position's row to the next in q and dq (q_ld), and in k, v, dk and dv (kv_ld):
  // Hq * D and Hkv * D in compact tensors, the projection's width in column blocks of a fused QKV
  // projection. out and dout are always compact [B, T, Hq, D].
  int64_t q_ld, kv_ld;
  const int32_t* doc_start = nullptr;  // [B, T], or null: every query sees keys from 0
  RopeTables rope;                     // set when q and k are still to be turned by RoPE
  // The first key query t of batch row b may see.
  int64_t first_key(int64_t b, int64_t t) const { return doc_start ? doc_start[b * T + t] : 0; }
  int64_t group() const { return Hq / Hkv; }
  // Offsets of the first row of (b, t, h) in q and dq, in k, v, dk and dv, in out and dout, and of
  // lse[b, h, t].
  int64_t q_row(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * q_ld + h * D; }
  int64_t kv_row(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * kv_ld + h * D; }
  int64_t out_row(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * D; }
  int64_t lse_at(int64_t b, int64_t h, int64_t t) const { return (b * Hq + h) * T + t; }
};
}  // namespace lt::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Query rows and key rows per block. 64 keeps a score tile (16 KiB in f32) and the packed k and v blocks
// in L1/L2 for head dims up to 128, and is a multiple of every vector length, so a row of a tile can be
// walked in whole vectors (the last one masked) without leaving the tile.
constexpr int64_t kBlock = 64;
static_assert(kBlock % HWY_LANES(float) == 0, "a tile row must hold whole vectors");
inline int64_t BlockCount(int64_t T) { return (T + kBlock - 1) / kBlock; }

// Each thread's working memory for one call: its part (thread_slot()) of one allocation the calling
// thread takes from the caching allocator, so steady-state steps allocate nothing from the system. Parts
// start on their own cache lines.
template <class T>
class ThreadScratch {
 public:
  explicit ThreadScratch(int64_t per_thread)
      : per_thread_((per_thread + kLineElements - 1) / kLineElements * kLineElements),
        storage_(Tensor::empty({num_threads() * per_thread_}, dtype_of<T>())) {}
  T* mine() const { return storage_.data<T>() + thread_slot() * per_thread_; }

 private:
  static constexpr int64_t kLineElements = 64 / static_cast<int64_t>(sizeof(T));
  int64_t per_thread_;
  Tensor storage_;
};

// ---- block GEMM ------------------------------------------------------------------------------------
// c[M, N] = alpha * A @ b (+ c when accumulate), where A[m, k] = a[m * a_row + k * a_col] (a transposed
// operand is the same matrix with its strides swapped), b is row-major [K, N] with leading dimension
// ldb, and c has leading dimension ldc. A tile of kRows rows x kVecs vectors of c stays in registers
// while k streams; every element is summed over k in order.
template <int kRows, int kVecs, class D, class T = hn::TFromD<D>>
HWY_INLINE void GemmTile(D d, int64_t K, T alpha, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t ldb,
                         bool accumulate, T* c, int64_t ldc) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<D>;
  V acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    V b_k[kVecs];
    for (int v = 0; v < kVecs; ++v) b_k[v] = hn::LoadU(d, b + k * ldb + v * lanes);
    for (int r = 0; r < kRows; ++r) {
      const V a_rk = hn::Set(d, a[r * a_row + k * a_col]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = hn::MulAdd(a_rk, b_k[v], acc[r][v]);
    }
  }
  const V valpha = hn::Set(d, alpha);
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVecs; ++v) {
      T* c_rv = c + r * ldc + v * lanes;
      V result = hn::Mul(valpha, acc[r][v]);
      if (accumulate) result = hn::Add(result, hn::LoadU(d, c_rv));
      hn::StoreU(result, d, c_rv);
    }
}

// With 32 registers (AVX-512) the tiles of a row group (kGroupRows below) are 4 vectors wide where the
// columns allow (a score row of 64 keys, a head dim of 64): 24 chains, and each k's broadcasts feed 24
// FMAs rather than 12, in 24 + 4 + 1 registers. The Xeon (Sapphire Rapids) has two 512-bit FMA ports,
// which 8 or 12 chains only just keep busy: at moe-m's shape (B 4, T 512, 8 heads of 64) 4-vector tiles
// took the attention kernel 0.93-0.95x the time (with 4-row groups), forward and backward, on 1 and 2
// threads. With 16 registers the tiles stay 2 vectors wide.
constexpr int64_t kWideTileVectors = HWY_LANES(float) > 8 ? 4 : 2;

// kRows rows of c, all N columns: wide tiles, then two vectors, then one, then single columns.
template <int kRows, class T>
void GemmRows(int64_t N, int64_t K, T alpha, const T* a, int64_t a_row, int64_t a_col, const T* b, int64_t ldb,
              bool accumulate, T* c, int64_t ldc) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t n = 0;
  for (; n + kWideTileVectors * lanes <= N; n += kWideTileVectors * lanes)
    GemmTile<kRows, kWideTileVectors>(d, K, alpha, a, a_row, a_col, b + n, ldb, accumulate, c + n, ldc);
  for (; n + 2 * lanes <= N; n += 2 * lanes)
    GemmTile<kRows, 2>(d, K, alpha, a, a_row, a_col, b + n, ldb, accumulate, c + n, ldc);
  for (; n + lanes <= N; n += lanes)
    GemmTile<kRows, 1>(d, K, alpha, a, a_row, a_col, b + n, ldb, accumulate, c + n, ldc);
  for (; n < N; ++n)
    for (int r = 0; r < kRows; ++r) {
      T sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += a[r * a_row + k * a_col] * b[k * ldb + n];
      T& out = c[r * ldc + n];
      out = accumulate ? out + alpha * sum : alpha * sum;
    }
}

// BlockGemm works on groups of kGroupRows rows of c (then the rows left), each in tiles of kGroupRows x
// 2 vectors (or wider, above), so at least 12 independent FMA chains per k, more than the 8 that cover a
// 4-cycle FMA latency on two FMA ports. With 16 registers (AVX2) that is 12 + 2 + 1 of them (with 4
// rows, moe-s's attention took 1.09x as long on the AVX2 path). On AVX-512 the 6 x 4 tiles load 10
// operands per 24 FMAs where 4 x 4 tiles load 8 per 16: on the Xeon the kernel took 0.90-0.98x the time
// in the backward and 0.92-1.0x in the forward with 6-row groups, at the shapes of moe-s, moe-m and
// dense-124m, on 1 and 2 threads, though the causal ranges below are coarser. (On Zen 4, with 2-vector
// tiles, 6-row groups had measured 1.5-3% slower than 4-row ones.) The group size changes no bits: each
// element is summed over k in order whatever tile holds it, and the causal ranges only add exact zeros.
constexpr int64_t kGroupRows = 6;

// On the diagonal (a query block and a key block that start at the same position) query row r sees keys
// 0..r only, and the probabilities and score gradients past that are exact zeros: each product skips
// what it would compute from them or into them, row group by row group. That is about half of a
// diagonal block's work, and with short sequences diagonal blocks are a large part of all blocks (4 of
// 10 at 256 positions).
enum class Causal {
  kNone,            // the whole product
  kColumnsUpToRow,  // c [queries, keys] (S, dP): only the columns of keys up to the group's last row,
                    // rounded up to whole vectors (ColumnsUpToRow); the rest of each row is not written
  kDepthUpToRow,    // A [queries, keys] (P, dS) times b [keys, D]: only k up to the group's last row
  kDepthFromRow,    // A = a transposed [keys, queries] (P^T, dS^T) times b [queries, D]: only k from the
                    // group's first row on
};

// The columns kColumnsUpToRow computes in row r's group: every key r may see, rounded up to whole
// vectors so the group's tiles stay vector-wide.
inline int64_t ColumnsUpToRow(int64_t r, int64_t N, int64_t lanes) {
  const int64_t group_end = r / kGroupRows * kGroupRows + kGroupRows;
  return std::min(N, (group_end + lanes - 1) / lanes * lanes);
}

// What a product computes for the row group starting at row m under `causal`: the columns [0, columns)
// and the depth [k_begin, k_end).
struct GroupRange {
  int64_t columns, k_begin, k_end;
};
inline GroupRange CausalRange(Causal causal, int64_t m, int64_t N, int64_t K, int64_t lanes) {
  switch (causal) {
    case Causal::kColumnsUpToRow: return {ColumnsUpToRow(m, N, lanes), 0, K};
    case Causal::kDepthUpToRow: return {N, 0, std::min(K, m + kGroupRows)};
    case Causal::kDepthFromRow: return {N, std::min(K, m), K};
    case Causal::kNone: break;
  }
  return {N, 0, K};
}

template <class T>
void BlockGemm(int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t a_row, int64_t a_col, const T* b,
               int64_t ldb, bool accumulate, T* c, int64_t ldc, Causal causal = Causal::kNone) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>()));
  for (int64_t m = 0; m < M; m += kGroupRows) {
    const auto [n, k_begin, k_end] = CausalRange(causal, m, N, K, lanes);
    const T* a_m = a + m * a_row + k_begin * a_col;
    const T* b_k = b + k_begin * ldb;
    const int64_t depth = k_end - k_begin;
    T* c_m = c + m * ldc;
    switch (std::min(kGroupRows, M - m)) {
      case 6: GemmRows<6>(n, depth, alpha, a_m, a_row, a_col, b_k, ldb, accumulate, c_m, ldc); break;
      case 5: GemmRows<5>(n, depth, alpha, a_m, a_row, a_col, b_k, ldb, accumulate, c_m, ldc); break;
      case 4: GemmRows<4>(n, depth, alpha, a_m, a_row, a_col, b_k, ldb, accumulate, c_m, ldc); break;
      case 3: GemmRows<3>(n, depth, alpha, a_m, a_row, a_col, b_k, ldb, accumulate, c_m, ldc); break;
      case 2: GemmRows<2>(n, depth, alpha, a_m, a_row, a_col, b_k, ldb, accumulate, c_m, ldc); break;
      default: GemmRows<1>(n, depth, alpha, a_m, a_row, a_col, b_k, ldb, accumulate, c_m, ldc); break;
    }
  }
}

// dst[i * kBlock + c] = src[c * ld + i] for the `rows` rows of one head of k or v: [rows, D] -> [D, rows].
template <class T>
void PackTransposed(const T* src, int64_t ld, int64_t rows, int64_t D, T* dst) {
  TransposeMatrix(src, ld, rows, D, dst, kBlock);
}

// The cos and sin tables [T, D/2] of RoPE (tensor/cpu/rope.cc) when q and k are column blocks of a fused
// QKV projection, still to be turned; null when q and k come rotated.
template <class T>
struct Rope {
  const T* cos = nullptr;
  const T* sin = nullptr;
  Rope() = default;
  explicit Rope(const RopeTables& tables)
      : cos(static_cast<const T*>(tables.cos)), sin(static_cast<const T*>(tables.sin)) {}
  bool on() const { return cos != nullptr; }
};

// Requests the lines of `rows` rows of D values, ld apart, to read them or (kForWrite) to write them.
// A head's rows in a fused QKV projection are a whole row of the projection apart (6 KiB at moe-m), each
// on a page of its own, where no hardware prefetcher follows them.
template <bool kForWrite = false, class T>
void PrefetchRows(const T* rows_at, int64_t ld, int64_t rows, int64_t D) {
  for (int64_t c = 0; c < rows; ++c)
    for (int64_t i = 0; i < D; i += 64 / static_cast<int64_t>(sizeof(T)))
      __builtin_prefetch(rows_at + c * ld + i, kForWrite ? 1 : 0);
}

// Rows GatherRows and ScatterRows request ahead of the one they copy: the misses overlap instead of
// queueing one after the other. At moe-m's shape (alternating runs of 60 calls), 4 rows ahead of the
// reads took the fused forward 0.94-0.98x and the backward 0.92-0.98x the time; 4 or 8 ahead of the
// writes took the backward another 0.88-0.91x.
constexpr int64_t kRowsAhead = 4;

// dst[c * D + i] = src[c * ld + i]: `rows` rows of one head gathered into a contiguous block, each
// turned by RoPE at its position t0 + c when rope is on (with the arithmetic of tensor/cpu/rope.cc, so
// the block has the bits a separate RoPE pass would have given). S: T's, or (T = float) a kept bf16 copy
// (uint16_t, autograd/saved.h), each row widened, exactly, and then turned in place: the same bits.
template <class T, class S = T>
void GatherRows(const S* src, int64_t ld, int64_t rows, int64_t D, T* dst, const Rope<T>& rope = {}, int64_t t0 = 0) {
  const int64_t half = D / 2;
  PrefetchRows(src, ld, std::min(rows, kRowsAhead), D);
  for (int64_t c = 0; c < rows; ++c) {
    if (c + kRowsAhead < rows) PrefetchRows(src + (c + kRowsAhead) * ld, ld, 1, D);
    T* out = dst + c * D;
    // The row as it is read: a bf16 one widened into place first (and then turned in place).
    const T* row = out;
    if constexpr (std::is_same_v<S, T>) row = src + c * ld;
    else WidenRowFromBf16(src + c * ld, D, out);
    if (rope.on()) RotateHalf<false>(row, out, rope.cos + (t0 + c) * half, rope.sin + (t0 + c) * half, half);
    else if constexpr (std::is_same_v<S, T>) std::copy_n(row, D, out);
  }
}

// `rows` rows of one head of v, [rows, D] -> [D, rows] (PackTransposed), from v itself or from its kept
// bf16 copy, widened first into `widened` [rows, D].
template <class T, class S>
void PackTransposedFrom(const S* src, int64_t ld, int64_t rows, int64_t D, T* dst, T* widened) {
  if constexpr (std::is_same_v<S, T>) {
    (void)widened;
    PackTransposed(src, ld, rows, D, dst);
  } else {
    GatherRows(src, ld, rows, D, widened);
    PackTransposed(widened, D, rows, D, dst);
  }
}

// A block of `rows` rows of one head to read: where they lie (ld apart), or, when rope is on, turned by
// RoPE at positions t0 .. into `rotated` (D apart). Returns the block's first row and its row stride.
template <class T>
std::pair<const T*, int64_t> TurnedRows(const T* rows_at, int64_t ld, int64_t rows, int64_t D, const Rope<T>& rope,
                                        int64_t t0, T* rotated) {
  if (!rope.on()) return {rows_at, ld};
  GatherRows(rows_at, ld, rows, D, rotated, rope, t0);
  return {rotated, D};
}

// dst[c * ld + i] = src[c * D + i]: a contiguous block of `rows` rows written out to rows ld apart,
// each turned back by RoPE at its position t0 + c when rope is on (the gradient of the unturned rows).
template <class T>
void ScatterRows(const T* src, int64_t rows, int64_t D, T* dst, int64_t ld, const Rope<T>& rope = {}, int64_t t0 = 0) {
  const int64_t half = D / 2;
  PrefetchRows<true>(dst, ld, std::min(rows, kRowsAhead), D);
  for (int64_t c = 0; c < rows; ++c) {
    if (c + kRowsAhead < rows) PrefetchRows<true>(dst + (c + kRowsAhead) * ld, ld, 1, D);
    if (rope.on())
      RotateHalf<true>(src + c * D, dst + c * ld, rope.cos + (t0 + c) * half, rope.sin + (t0 + c) * half, half);
    else
      std::copy_n(src + c * D, D, dst + c * ld);
  }
}

// ---- bf16 block products ----------------------------------------------------------------------------
// Under mixed precision (--dtype bf16, f32 tensors, a CPU with AVX512_BF16) the block products run on
// VDPBF16PS (tensor/cpu/bf16_dot.h), or on the AMX tiles where the bf16 GEMM uses them, with the GPU's
// contract (tensor/cuda/attention.cu): q, k, v and dout rounded to bf16 as they become operands, and P and
// dS as operands of the second products; scores, maxima, sums, lse and every product's sums in f32. D_i
// takes dout rounded alike, so that it agrees with dP = dout v^T. The operands are "pairs", two consecutive
// k's of one row or column in a 32-bit unit: a left operand's pairs run along its rows (or, transposed,
// down its columns: the strides swap), a right operand [K, N] is held as [K / 2][N] rows of pairs. The
// walks, the causal ranges and the order in which each gradient sum meets its terms are the f32 kernel's,
// so the results are deterministic and the same for any thread count; with VDPBF16PS each element is one
// chain over its k-pairs in order, on the tiles in theirs (tensor/cpu/amx.h). (The helpers are templates
// on the element type, instantiated, like the kernels' pair walks, only where LT_ATTENTION_PAIRS is set.)
#undef LT_ATTENTION_PAIRS  // this file is compiled once per target: the pair kernels are instantiated on
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3  // the AVX-512 targets only, as the bf16 GEMM's are
#define LT_ATTENTION_PAIRS 1
#endif
static_assert(kGroupRows == kBf16TileRows, "a row group is one tile of the bf16 kernel");

// k-pairs of a whole block of keys or queries.
constexpr int64_t kPairBlock = kBlock / 2;
// The row stride, in units, of a right operand [pairs][N] whose N is D: D rounded up to whole vectors, as
// accumulate_rows_bf16 reads each row in whole vectors.
inline int64_t PairRowStride(int64_t D) { return (D + 15) / 16 * 16; }

// dst[r * dst_ld + kp] = the pair (src[r][2kp], src[r][2kp + 1]) for r < rows and 2kp < cols (the last
// pair of an odd cols padded with zero).
template <class T>
void PairAlongRows(const T* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst, int64_t dst_ld) {
  for (int64_t r = 0; r < rows; ++r) row_to_pairs(src + r * ld, cols, dst + r * dst_ld);
}

// dst[kp * dst_ld + c] = the pair (src[2kp][c], src[2kp + 1][c]) for 2kp < rows and c < cols (a row past
// the end reads as zeros).
template <class T>
void PairDownColumns(const T* src, int64_t ld, int64_t rows, int64_t cols, uint32_t* dst, int64_t dst_ld) {
  for (int64_t kp = 0; 2 * kp < rows; ++kp)
    interleave_to_pairs(src + 2 * kp * ld, 2 * kp + 1 < rows ? src + (2 * kp + 1) * ld : nullptr, cols,
                        dst + kp * dst_ld);
}

// c[r][0 : cols] = alpha * sums[r][0 : cols] (+ c[r] when accumulate) for r < rows: a block of a pair
// product written out, as BlockGemm's tiles write theirs (sums_ld floats between rows of sums).
template <class T>
void WriteSums(const float* sums, int64_t sums_ld, int64_t rows, int64_t cols, T alpha, bool accumulate, T* c,
               int64_t ldc) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto valpha = hn::Set(d, alpha);
  for (int64_t r = 0; r < rows; ++r) {
    T* c_r = c + r * ldc;
    for (int64_t j = 0; j < cols; j += lanes) {
      const auto lanes_in = hn::FirstN(d, static_cast<size_t>(cols - j));
      auto result = hn::Mul(valpha, hn::LoadU(d, sums + r * sums_ld + j));
      if (accumulate) result = hn::Add(result, hn::MaskedLoad(lanes_in, d, c_r + j));
      hn::BlendedStore(result, lanes_in, d, c_r + j);
    }
  }
}

// PairGemm on the AMX tiles (tensor/cpu/amx.h), where the bf16 GEMM uses them: blocks of 32 rows x 64
// columns, both operands first copied into the tiles' layout (A as 32 rows of pairs, B as a panel of 64
// columns, zero-padded to whole steps of kAmxDepthUnits pairs), a few KiB next to the block's 32 x 64 x K
// product. A block's rows share one depth, so each row keeps its group's causal range by having its pairs
// outside it zeroed: the tiles would otherwise read what the ranges leave unwritten (dS past each row's
// columns, and so dS^T); kColumnsUpToRow computes every column. Each element is summed over the same
// pairs whatever the rows or the thread, in the tiles' order.
template <class T>
void PairGemmOnTiles(int64_t M, int64_t N, int64_t K, T alpha, const uint32_t* a, int64_t a_row, int64_t a_pair,
                     const uint32_t* b, int64_t ldb, bool accumulate, T* c, int64_t ldc, Causal causal) {
  const int64_t pairs = (K + 1) / 2;
  const int64_t units = std::max<int64_t>(1, (pairs + kAmxDepthUnits - 1) / kAmxDepthUnits) * kAmxDepthUnits;
  thread_local std::vector<uint32_t> a_rows, b_panel;  // grown once to the largest depth met
  a_rows.resize(static_cast<size_t>(kAmxBlockRows * units));
  b_panel.resize(static_cast<size_t>(units * kAmxBlockColumns));
  alignas(64) float block[kAmxBlockRows * kAmxBlockColumns];
  for (int64_t c0 = 0; c0 < N; c0 += kAmxBlockColumns) {
    const int64_t cols = std::min<int64_t>(kAmxBlockColumns, N - c0);
    std::fill(b_panel.begin(), b_panel.end(), 0u);
    for (int64_t kp = 0; kp < pairs; ++kp)
      std::copy_n(b + kp * ldb + c0, cols, b_panel.data() + kp * kAmxBlockColumns);
    for (int64_t r0 = 0; r0 < M; r0 += kAmxBlockRows) {
      const int64_t rows = std::min<int64_t>(kAmxBlockRows, M - r0);
      std::fill(a_rows.begin(), a_rows.end(), 0u);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t m = r0 + r;
        const GroupRange range = CausalRange(causal, m / kGroupRows * kGroupRows, N, K, kBf16TileColumns);
        for (int64_t kp = range.k_begin / 2; kp < (range.k_end + 1) / 2; ++kp)
          a_rows[r * units + kp] = a[m * a_row + kp * a_pair];
      }
      amx_block(units, a_rows.data(), units, b_panel.data(), block);
      WriteSums(block, kAmxBlockColumns, rows, cols, alpha, accumulate, c + r0 * ldc + c0, ldc);
    }
  }
}

// BlockGemm on pairs: c[M, N] = alpha * A @ b (+ c when accumulate), A's pair kp of row m at a[m * a_row +
// kp * a_pair], b [ceil(K / 2)][N] with rows ldb units apart (each readable up to N rounded up to 16). K
// counts elements; the causal ranges are BlockGemm's, in pairs (a group's 6 rows begin and end on even k).
// With VDPBF16PS, or on the AMX tiles where `tiles` (PairGemmOnTiles).
template <class T>
void PairGemm(bool tiles, int64_t M, int64_t N, int64_t K, T alpha, const uint32_t* a, int64_t a_row, int64_t a_pair,
              const uint32_t* b, int64_t ldb, bool accumulate, T* c, int64_t ldc, Causal causal = Causal::kNone) {
  static_assert(std::is_same_v<T, float>, "bf16 products take f32 tensors");
  if (tiles) return PairGemmOnTiles(M, N, K, alpha, a, a_row, a_pair, b, ldb, accumulate, c, ldc, causal);
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  alignas(64) float tile[kBf16TileRows * kBf16TileColumns];
  for (int64_t m = 0; m < M; m += kGroupRows) {
    const auto [n, k_begin, k_end] = CausalRange(causal, m, N, K, lanes);
    const int64_t p_begin = k_begin / 2, pairs = std::max<int64_t>(0, (k_end + 1) / 2 - p_begin);
    const int rows = static_cast<int>(std::min(kGroupRows, M - m));
    for (int64_t c0 = 0; c0 < n; c0 += kBf16TileColumns) {
      const int64_t cols = std::min<int64_t>(kBf16TileColumns, n - c0);
      accumulate_rows_bf16(pairs, rows, static_cast<int>((cols + 15) / 16), a + m * a_row + p_begin * a_pair, a_row,
                           a_pair, b + p_begin * ldb + c0, ldb, tile);
      WriteSums(tile, kBf16TileColumns, rows, cols, alpha, accumulate, c + m * ldc + c0, ldc);
    }
  }
}

// ---- row helpers ----------------------------------------------------------------------------------
// y: T's, or a kept bf16 copy (uint16_t) widened as it is read.
template <class T, class E>
T Dot(const T* x, const E* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = hn::MulAdd(hn::LoadU(d, x + i), LoadWidened(d, y + i), acc);
  T sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += x[i] * Widened<T, E>(y[i]);
  return sum;
}

// y[i] = alpha * x[i]; y may be x.
template <class T>
void ScaleRow(T alpha, const T* x, T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto valpha = hn::Set(d, alpha);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(valpha, hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] = alpha * x[i];
}

// The number of keys of key block jb that query row r of query block ib may see: all of them below the
// diagonal; on it (the blocks start at the same position) keys 0..r.
inline int64_t VisibleKeys(int64_t ib, int64_t jb, int64_t r, int64_t keys) {
  return jb < ib ? keys : std::min(keys, r + 1);
}

// Tile rows are walked in whole vectors over [0, keys) rounded up; the lanes past `visible` keys are
// masked to 0, so the products that read the tile with K = keys see exact zeros there.
template <class D>
HWY_INLINE hn::Mask<D> FirstLanes(D d, int64_t count) {
  return hn::FirstN(d, static_cast<size_t>(std::max<int64_t>(count, 0)));
}

// The lanes of the vector starting at column c that fall in [lo, hi).
template <class D>
HWY_INLINE hn::Mask<D> RangeLanes(D d, int64_t lo, int64_t hi, int64_t c) {
  return hn::AndNot(FirstLanes(d, lo - c), FirstLanes(d, hi - c));
}

// The softmax passes over a score tile take kSoftmaxRows rows at a time, each pass's rows interleaved
// vector by vector: a row of 64 keys is only 4 vectors, and one row at a time its maximum, exp and sum
// (two horizontal reductions, each feeding the next step) form one chain of latencies. Four rows at a
// time took the Xeon's forward 0.94x the time (moe-m's shape, 1 and 2 threads). Every row's arithmetic
// is the same as alone, in the same order, so the bits are unchanged.
constexpr int64_t kSoftmaxRows = 4;
static_assert(kBlock % kSoftmaxRows == 0, "a block's rows split into whole softmax groups");

// Rows of a tile, row stride kBlock, and the keys [lo[r], hi[r]) that each row sees.
template <class T>
struct TileRows {
  T* rows;
  const int64_t* lo;
  const int64_t* hi;
  T* row(int r) const { return rows + r * kBlock; }
};

// Whether each of the kRows rows sees all `keys` keys, in whole vectors: then no lane needs a mask (the
// blocks below the diagonal without packed documents, most of a long sequence's blocks). The masks
// select every lane there, so leaving them out changes no value.
template <int kRows, class T>
HWY_INLINE bool SeesWholeVectors(const TileRows<T>& tile, int64_t keys, int64_t lanes) {
  if (keys % lanes != 0) return false;
  for (int r = 0; r < kRows; ++r)
    if (tile.lo[r] != 0 || tile.hi[r] != keys) return false;
  return true;
}

// max[r] = the largest of row r over [lo[r], hi[r]) (-inf for an empty range), for kRows rows.
template <int kRows, class T>
HWY_INLINE void RowMaxes(const TileRows<T>& tile, T* max) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto neg_inf = hn::Set(d, -std::numeric_limits<T>::infinity());
  hn::Vec<decltype(d)> vmax[kRows];
  if (SeesWholeVectors<kRows>(tile, tile.hi[0], lanes)) {
    for (int r = 0; r < kRows; ++r) vmax[r] = neg_inf;
    for (int64_t c = 0; c < tile.hi[0]; c += lanes)
      for (int r = 0; r < kRows; ++r) vmax[r] = hn::Max(vmax[r], hn::LoadU(d, tile.row(r) + c));
    for (int r = 0; r < kRows; ++r) max[r] = hn::GetLane(hn::MaxOfLanes(d, vmax[r]));
    return;
  }
  int64_t begin = kBlock, end = 0;
  for (int r = 0; r < kRows; ++r) {
    vmax[r] = neg_inf;
    begin = std::min(begin, tile.lo[r] - tile.lo[r] % lanes);
    end = std::max(end, tile.hi[r]);
  }
  for (int64_t c = begin; c < end; c += lanes)
    for (int r = 0; r < kRows; ++r)
      vmax[r] = hn::Max(
          vmax[r], hn::IfThenElse(RangeLanes(d, tile.lo[r], tile.hi[r], c), hn::LoadU(d, tile.row(r) + c), neg_inf));
  for (int r = 0; r < kRows; ++r) max[r] = hn::GetLane(hn::MaxOfLanes(d, vmax[r]));
}

// row r [c] = exp(row r [c] - shift[r]) for c in [lo[r], hi[r]), 0 elsewhere in [0, keys); sum[r] = the
// row's sum, for kRows rows. Vectors wholly outside a row's range (half of a diagonal block) are zeroed
// without evaluating exp, whose ~16 instructions per vector are as many as a tile's FMAs at small head
// dims; their scores may then be unwritten (Causal::kColumnsUpToRow).
template <int kRows, class T>
HWY_INLINE void ExpRows(const TileRows<T>& tile, int64_t keys, const T* shift, T* sum) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<decltype(d)> vshift[kRows], vsum[kRows];
  for (int r = 0; r < kRows; ++r) {
    vshift[r] = hn::Set(d, shift[r]);
    vsum[r] = hn::Zero(d);
  }
  if (SeesWholeVectors<kRows>(tile, keys, lanes)) {
    for (int64_t c = 0; c < keys; c += lanes)
      for (int r = 0; r < kRows; ++r) {
        T* at = tile.row(r) + c;
        const auto p = ExpNonPositive(d, hn::Sub(hn::LoadU(d, at), vshift[r]));
        hn::StoreU(p, d, at);
        vsum[r] = hn::Add(vsum[r], p);
      }
    for (int r = 0; r < kRows; ++r) sum[r] = hn::GetLane(hn::SumOfLanes(d, vsum[r]));
    return;
  }
  for (int64_t c = 0; c < keys; c += lanes)
    for (int r = 0; r < kRows; ++r) {
      T* at = tile.row(r) + c;
      if (c >= tile.hi[r] || c + lanes <= tile.lo[r]) {
        hn::StoreU(hn::Zero(d), d, at);
        continue;
      }
      const auto p = hn::IfThenElseZero(RangeLanes(d, tile.lo[r], tile.hi[r], c),
                                        ExpNonPositive(d, hn::Sub(hn::LoadU(d, at), vshift[r])));
      hn::StoreU(p, d, at);
      vsum[r] = hn::Add(vsum[r], p);
    }
  for (int r = 0; r < kRows; ++r) sum[r] = hn::GetLane(hn::SumOfLanes(d, vsum[r]));
}

// The online-softmax step of kRows rows of the forward's score tile: each row's running maximum and sum
// take in the block, the scores become exp(s - new maximum), and rescale[r] = exp(old maximum - new
// maximum) is the factor for the row's output accumulator (0 on the first block, where m = -inf; 1 for a
// row that sees none of the block's keys, which are zeroed and leave the row as it was).
template <int kRows, class T>
HWY_INLINE void OnlineSoftmaxRows(const TileRows<T>& tile, int64_t keys, T* row_max, T* row_sum, T* rescale) {
  T block_max[kRows], new_max[kRows], block_sum[kRows];
  RowMaxes<kRows>(tile, block_max);
  for (int r = 0; r < kRows; ++r) new_max[r] = std::max(row_max[r], block_max[r]);
  ExpRows<kRows>(tile, keys, new_max, block_sum);
  for (int r = 0; r < kRows; ++r) {
    if (tile.lo[r] >= tile.hi[r]) {
      rescale[r] = T(1);
      continue;
    }
    rescale[r] = std::exp(row_max[r] - new_max[r]);
    row_sum[r] = row_sum[r] * rescale[r] + block_sum[r];
    row_max[r] = new_max[r];
  }
}

// dS = P * (dP - D_i) over the first `width` columns of the row, in place in dP (P is 0 past the visible
// keys, so dS is too).
template <class T>
void ScoreGradRow(const T* p_row, T* dp_row, int64_t width, T d_i) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vd_i = hn::Set(d, d_i);
  for (int64_t c = 0; c < width; c += lanes) {
    const auto ds = hn::Mul(hn::LoadU(d, p_row + c), hn::Sub(hn::LoadU(d, dp_row + c), vd_i));
    hn::StoreU(hn::IfThenElseZero(FirstLanes(d, width - c), ds), d, dp_row + c);
  }
}

// [lo[r], hi[r]): the keys of key block jb that row r of query block ib (rows from i0 on) sees; empty when
// the row's document starts after the block.
inline void VisibleRanges(const AttentionShape& s, int64_t b, int64_t i0, int64_t rows, int64_t ib, int64_t jb,
                          int64_t keys, int64_t* lo, int64_t* hi) {
  for (int64_t r = 0; r < rows; ++r) {
    lo[r] = std::max<int64_t>(0, s.first_key(b, i0 + r) - jb * kBlock);
    hi[r] = VisibleKeys(ib, jb, r, keys);
  }
}

// ---- forward ----------------------------------------------------------------------------------------
// kPairs: the block products on bf16 pairs (T = float; "bf16 block products" above).
template <class T, bool kPairs = false>
void AttentionForwardT(const AttentionShape& s, const T* q, const T* k, const T* v, T scale, T* out, T* lse) {
  const int64_t D = s.D, out_ld = s.Hq * D, blocks = BlockCount(s.T);
  const Rope<T> rope(s.rope);
  // Every query head of a group reads the same k and v blocks: pack them once per call rather than once
  // per task, k transposed block by block [B, Hkv, blocks, D, kBlock] and v contiguous [B, Hkv, T, D]; in
  // pairs, k's block [D / 2][kBlock] and v's [kBlock / 2][D] (rows PairRowStride(D) units apart). The
  // storage comes from the caching allocator, so steady-state steps allocate nothing.
  const int64_t d_pairs = (D + 1) / 2, v_pair_ld = PairRowStride(D);
  const int64_t k_block_elements = kPairs ? d_pairs * kBlock : D * kBlock;
  const int64_t v_block_elements = kPairs ? kPairBlock * v_pair_ld : kBlock * D;
  // (A pair block's last row is read up to whole vectors: one vector of slack past the end.)
  const Tensor packed =
      Tensor::empty({s.B * s.Hkv * blocks * (k_block_elements + v_block_elements) + 16}, dtype_of<T>());
  using Operand = std::conditional_t<kPairs, uint32_t, T>;
  Operand* k_blocks = reinterpret_cast<Operand*>(packed.data<T>());
  Operand* v_blocks = k_blocks + s.B * s.Hkv * blocks * k_block_elements;
  auto k_block_at = [&](int64_t b, int64_t kv, int64_t jb) {
    return k_blocks + ((b * s.Hkv + kv) * blocks + jb) * k_block_elements;
  };
  auto v_block_at = [&](int64_t b, int64_t kv, int64_t jb) {
    return v_blocks + ((b * s.Hkv + kv) * blocks + jb) * v_block_elements;
  };
  const ThreadScratch<T> pack_scratch(kBlock * D * (kPairs ? 2 : 1));
  parallel_for(s.B * s.Hkv * blocks, 1, [&](int64_t begin, int64_t end) {
    T* k_rotated = pack_scratch.mine();  // a key block turned by RoPE, before its transpose
    for (int64_t task = begin; task < end; ++task) {
      const int64_t jb = task % blocks, kv = task / blocks % s.Hkv, b = task / (blocks * s.Hkv);
      const int64_t j0 = jb * kBlock, keys = std::min(kBlock, s.T - j0);
      const auto [k_j, k_ld] = TurnedRows(k + s.kv_row(b, j0, kv), s.kv_ld, keys, D, rope, j0, k_rotated);
      if constexpr (kPairs) {
        T* k_transposed = k_rotated + kBlock * D;
        PackTransposed(k_j, k_ld, keys, D, k_transposed);
        PairDownColumns(k_transposed, kBlock, D, keys, k_block_at(b, kv, jb), kBlock);
        PairDownColumns(v + s.kv_row(b, j0, kv), s.kv_ld, keys, D, v_block_at(b, kv, jb), v_pair_ld);
      } else {
        PackTransposed(k_j, k_ld, keys, D, k_block_at(b, kv, jb));
        GatherRows(v + s.kv_row(b, j0, kv), s.kv_ld, keys, D, v_block_at(b, kv, jb));
      }
    }
  });

  // In pairs, the query block's rows and the probabilities' rows as pairs; on the AMX tiles where the bf16
  // GEMM uses them.
  const bool tiles = kPairs && amx_tiles() != AmxTiles::Off;
  const int64_t pair_scratch = kPairs ? (kBlock * d_pairs + kBlock * kPairBlock) * sizeof(uint32_t) / sizeof(T) : 0;
  const ThreadScratch<T> block_scratch(kBlock * kBlock + 2 * kBlock + kBlock * D + pair_scratch);
  parallel_for(s.B * s.Hq * blocks, 1, [&](int64_t begin, int64_t end) {
    const AmxTileScope tiles_in_use(tiles);
    T* scores = block_scratch.mine();
    T* row_max = scores + kBlock * kBlock;  // m per query row
    T* row_sum = row_max + kBlock;          // l per query row
    T* q_rotated = row_sum + kBlock;        // [kBlock, D]: the query block turned by RoPE
    auto* q_pairs = reinterpret_cast<uint32_t*>(q_rotated + kBlock * D);  // [kBlock][D / 2]
    uint32_t* p_pairs = q_pairs + kBlock * d_pairs;                        // [kBlock][kBlock / 2]
    T rescale[kBlock];
    int64_t lo[kBlock], hi[kBlock];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t ib = task % blocks, h = task / blocks % s.Hq, b = task / (blocks * s.Hq);
      const int64_t kv = h / s.group();
      const int64_t i0 = ib * kBlock, rows = std::min(kBlock, s.T - i0);
      const auto [q_i, q_i_ld] = TurnedRows(q + s.q_row(b, i0, h), s.q_ld, rows, D, rope, i0, q_rotated);
      if constexpr (kPairs) PairAlongRows(q_i, q_i_ld, rows, D, q_pairs, d_pairs);
      T* acc = out + s.out_row(b, i0, h);  // the unnormalised output rows, summed in place (out_ld apart)
      std::fill(row_max, row_max + rows, -std::numeric_limits<T>::infinity());
      std::fill(row_sum, row_sum + rows, T(0));
      const int64_t first_jb = s.first_key(b, i0) / kBlock;
      for (int64_t jb = first_jb; jb <= ib; ++jb) {
        const int64_t j0 = jb * kBlock, keys = std::min(kBlock, s.T - j0);
        const bool diagonal = jb == ib, first = jb == first_jb;
        const Causal columns = diagonal ? Causal::kColumnsUpToRow : Causal::kNone;
        if constexpr (kPairs)
          PairGemm(tiles, rows, keys, D, scale, q_pairs, d_pairs, 1, k_block_at(b, kv, jb), kBlock, false, scores,
                   kBlock, columns);
        else
          BlockGemm(rows, keys, D, scale, q_i, q_i_ld, 1, k_block_at(b, kv, jb), kBlock, false, scores, kBlock,
                    columns);
        VisibleRanges(s, b, i0, rows, ib, jb, keys, lo, hi);
        int64_t r = 0;
        for (; r + kSoftmaxRows <= rows; r += kSoftmaxRows)
          OnlineSoftmaxRows<kSoftmaxRows>(TileRows<T>{scores + r * kBlock, lo + r, hi + r}, keys, row_max + r,
                                          row_sum + r, rescale + r);
        for (; r < rows; ++r)
          OnlineSoftmaxRows<1>(TileRows<T>{scores + r * kBlock, lo + r, hi + r}, keys, row_max + r, row_sum + r,
                               rescale + r);
        // The first block writes the rows (what out held before is not read: 0 x NaN would stay NaN); the
        // later ones rescale and add.
        if (!first)
          for (r = 0; r < rows; ++r)
            if (rescale[r] != T(1)) ScaleRow(rescale[r], acc + r * out_ld, acc + r * out_ld, D);
        const Causal depth = diagonal ? Causal::kDepthUpToRow : Causal::kNone;
        if constexpr (kPairs) {
          PairAlongRows(scores, kBlock, rows, keys, p_pairs, kPairBlock);
          PairGemm(tiles, rows, D, keys, T(1), p_pairs, kPairBlock, 1, v_block_at(b, kv, jb), v_pair_ld, !first, acc,
                   out_ld, depth);
        } else {
          BlockGemm(rows, D, keys, T(1), scores, kBlock, 1, v_block_at(b, kv, jb), D, !first, acc, out_ld, depth);
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        ScaleRow(T(1) / row_sum[r], acc + r * out_ld, acc + r * out_ld, D);
        lse[s.lse_at(b, h, i0 + r)] = row_max[r] + std::log(row_sum[r]);
      }
    }
  });
}

// ---- backward ---------------------------------------------------------------------------------------
// kPairs: the block products on bf16 pairs (T = float; "bf16 block products" above). S: the element type of
// q, k, v and out, T's or (T = float) bf16 (uint16_t: the copies autograd kept under mixed precision, read
// widened, with the bits of the kernel on widened copies).
template <class T, bool kPairs = false, class S = T>
void AttentionBackwardT(const AttentionShape& s, const S* q, const S* k, const S* v, const S* out, const T* lse,
                        const T* dout, T scale, T* dq, T* dk, T* dv) {
  const int64_t D = s.D, out_ld = s.Hq * D, blocks = BlockCount(s.T), group = s.group();
  const Rope<T> rope(s.rope);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>()));
  const int64_t T_padded = blocks * kBlock;
  const int64_t sum_buffers = rope.on() ? 2 * T_padded * D + kBlock * D : 0;
  // In pairs: per key block k^T and v^T [D / 2][kBlock] and k [kBlock / 2][PairRowStride(D)]; per query
  // block q and dout as rows of pairs [kBlock][D / 2] and paired down their columns [kBlock / 2][..];
  // per tile P^T and dS^T paired down P's and dS's columns [kBlock / 2][kBlock], dS's rows [kBlock][kBlock /
  // 2]; and one vector of slack, as a pair block's last row is read in whole vectors.
  const int64_t d_pairs = (D + 1) / 2, d_pair_ld = PairRowStride(D);
  const int64_t key_block_units = 2 * d_pairs * kBlock + kPairBlock * d_pair_ld;
  const int64_t query_block_units = 2 * (kBlock * d_pairs + kPairBlock * d_pair_ld);
  const int64_t pair_units = kPairs ? blocks * key_block_units + query_block_units + 3 * kBlock * kPairBlock + 16 : 0;
  const bool tiles = kPairs && amx_tiles() != AmxTiles::Off;  // the AMX tiles, where the bf16 GEMM uses them
  const int64_t widened_v = std::is_same_v<S, T> ? 0 : kBlock * D;  // a block of v widened from its copy
  const ThreadScratch<T> task_scratch(2 * kBlock * kBlock + 3 * T_padded * D + 2 * kBlock * D + kBlock + sum_buffers +
                                      widened_v + pair_units * static_cast<int64_t>(sizeof(uint32_t) / sizeof(T)));
  parallel_for(s.B * s.Hkv, 1, [&](int64_t begin, int64_t end) {
    const AmxTileScope tiles_in_use(tiles);
    // The task's kv head is packed once for the whole sequence (k and v transposed block by block, k
    // contiguous), and each query block is gathered once. Each gradient sum's first term is written
    // rather than added (dk and dv of a key block: the first query head's diagonal block, which every
    // key block has; dq of a query block: its first key block), so no sum needs zeroing.
    // With compact q, k and v the sums are made where they belong, in dq, dk and dv: no buffer to copy
    // out of, and their stores overlap the products rather than stalling a copy on lines in no cache.
    // In a fused projection (rope on) they are made in contiguous buffers and written out turned back,
    // dq after its block's last key block and dk and dv after the task's last one: there a block's rows
    // lie a projection row apart, and dq's, dk's and dv's rows of one position share the same few L1
    // sets (6 KiB apart at moe-m), where the products' C tiles would evict each other.
    T* probs = task_scratch.mine();
    T* dprobs = probs + kBlock * kBlock;  // dP, then dS in place
    T* k_t = dprobs + kBlock * kBlock;    // [blocks, D, kBlock]: each key block transposed
    T* v_t = k_t + T_padded * D;          // [blocks, D, kBlock]
    T* k_rows = v_t + T_padded * D;       // [T, D]
    T* q_i = k_rows + T_padded * D;       // [kBlock, D]: the query block
    T* dout_i = q_i + kBlock * D;         // [kBlock, D]
    T* row_dot = dout_i + kBlock * D;     // D_i = rowsum(dout * out) of the query block's rows
    T* dk_sums = row_dot + kBlock;        // with rope: [T, D] each, and [kBlock, D]
    T* dv_sums = dk_sums + T_padded * D;
    T* dq_sums = dv_sums + T_padded * D;
    T* v_widened = row_dot + kBlock + sum_buffers;                                              // [kBlock, D]
    auto* key_pairs = reinterpret_cast<uint32_t*>(v_widened + widened_v);  // per key block:
    auto k_t_pairs_at = [&](int64_t jb) { return key_pairs + jb * key_block_units; };      // k^T
    auto v_t_pairs_at = [&](int64_t jb) { return k_t_pairs_at(jb) + d_pairs * kBlock; };  // v^T
    auto k_pairs_at = [&](int64_t jb) { return v_t_pairs_at(jb) + d_pairs * kBlock; };    // k
    uint32_t* q_row_pairs = key_pairs + blocks * key_block_units;
    uint32_t* q_column_pairs = q_row_pairs + kBlock * d_pairs;
    uint32_t* dout_row_pairs = q_column_pairs + kPairBlock * d_pair_ld;
    uint32_t* dout_column_pairs = dout_row_pairs + kBlock * d_pairs;
    uint32_t* p_column_pairs = dout_column_pairs + kPairBlock * d_pair_ld;
    uint32_t* ds_column_pairs = p_column_pairs + kPairBlock * kBlock;
    uint32_t* ds_row_pairs = ds_column_pairs + kPairBlock * kBlock;
    int64_t lo[kBlock], hi[kBlock];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / s.Hkv, kv = task % s.Hkv;
      // Where dk and dv are summed, and their row stride.
      T* dk_to = rope.on() ? dk_sums : dk + s.kv_row(b, 0, kv);
      T* dv_to = rope.on() ? dv_sums : dv + s.kv_row(b, 0, kv);
      const int64_t dkv_ld = rope.on() ? D : s.kv_ld;
      GatherRows(k + s.kv_row(b, 0, kv), s.kv_ld, s.T, D, k_rows, rope, 0);
      PrefetchRows(v + s.kv_row(b, 0, kv), s.kv_ld, std::min(kBlock, s.T), D);
      for (int64_t jb = 0; jb < blocks; ++jb) {
        const int64_t j0 = jb * kBlock, keys = std::min(kBlock, s.T - j0);
        if (jb + 1 < blocks)
          PrefetchRows(v + s.kv_row(b, j0 + kBlock, kv), s.kv_ld, std::min(kBlock, s.T - j0 - kBlock), D);
        PackTransposed(k_rows + j0 * D, D, keys, D, k_t + jb * D * kBlock);
        PackTransposedFrom(v + s.kv_row(b, j0, kv), s.kv_ld, keys, D, v_t + jb * D * kBlock, v_widened);
        if constexpr (kPairs) {
          PairDownColumns(k_t + jb * D * kBlock, kBlock, D, keys, k_t_pairs_at(jb), kBlock);
          PairDownColumns(v_t + jb * D * kBlock, kBlock, D, keys, v_t_pairs_at(jb), kBlock);
          PairDownColumns(k_rows + j0 * D, D, keys, D, k_pairs_at(jb), d_pair_ld);
        }
      }
      // Each sum meets its terms in a fixed order (dk, dv of a key block: query head, then query block;
      // dq of a query block: key block), whatever the thread count.
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kv * group + g;
        for (int64_t ib = 0; ib < blocks; ++ib) {
          const int64_t i0 = ib * kBlock, rows = std::min(kBlock, s.T - i0);
          GatherRows(q + s.q_row(b, i0, h), s.q_ld, rows, D, q_i, rope, i0);
          GatherRows(dout + s.out_row(b, i0, h), out_ld, rows, D, dout_i);
          if constexpr (kPairs) {
            round_to_bf16(dout_i, rows * D);  // D_i from dout as dP's product reads it
            PairAlongRows(q_i, D, rows, D, q_row_pairs, d_pairs);
            PairDownColumns(q_i, D, rows, D, q_column_pairs, d_pair_ld);
            PairAlongRows(dout_i, D, rows, D, dout_row_pairs, d_pairs);
            PairDownColumns(dout_i, D, rows, D, dout_column_pairs, d_pair_ld);
          }
          for (int64_t r = 0; r < rows; ++r) row_dot[r] = Dot(dout_i + r * D, out + s.out_row(b, i0 + r, h), D);
          T* dq_i = rope.on() ? dq_sums : dq + s.q_row(b, i0, h);
          const int64_t dq_ld = rope.on() ? D : s.q_ld;
          // Key blocks before the one holding the block's first document start add nothing (the starts
          // never decrease along a row, so no row of the block sees them).
          const int64_t first_jb = s.first_key(b, i0) / kBlock;
          for (int64_t jb = first_jb; jb <= ib; ++jb) {
            const int64_t j0 = jb * kBlock, keys = std::min(kBlock, s.T - j0);
            const T* k_t_j = k_t + jb * D * kBlock;
            const T* v_t_j = v_t + jb * D * kBlock;
            T* dk_j = dk_to + j0 * dkv_ld;
            T* dv_j = dv_to + j0 * dkv_ld;
            const bool diagonal = jb == ib;
            const bool add_kv = !(diagonal && g == 0), add_q = jb != first_jb;
            const Causal columns = diagonal ? Causal::kColumnsUpToRow : Causal::kNone;
            const Causal depth_up_to_row = diagonal ? Causal::kDepthUpToRow : Causal::kNone;
            const Causal depth_from_row = diagonal ? Causal::kDepthFromRow : Causal::kNone;
            // S = scale q k^T, then P in place
            if constexpr (kPairs)
              PairGemm(tiles, rows, keys, D, scale, q_row_pairs, d_pairs, 1, k_t_pairs_at(jb), kBlock, false, probs,
                       kBlock, columns);
            else
              BlockGemm(rows, keys, D, scale, q_i, D, 1, k_t_j, kBlock, false, probs, kBlock, columns);
            VisibleRanges(s, b, i0, rows, ib, jb, keys, lo, hi);
            const T* lse_i = lse + s.lse_at(b, h, i0);
            T unused_sums[kSoftmaxRows];
            int64_t r = 0;
            for (; r + kSoftmaxRows <= rows; r += kSoftmaxRows)
              ExpRows<kSoftmaxRows>(TileRows<T>{probs + r * kBlock, lo + r, hi + r}, keys, lse_i + r, unused_sums);
            for (; r < rows; ++r)
              ExpRows<1>(TileRows<T>{probs + r * kBlock, lo + r, hi + r}, keys, lse_i + r, unused_sums);
            // dv += P^T dout; dP = dout v^T, then dS in place
            if constexpr (kPairs) {
              PairDownColumns(probs, kBlock, rows, keys, p_column_pairs, kBlock);
              PairGemm(tiles, keys, D, rows, T(1), p_column_pairs, 1, kBlock, dout_column_pairs, d_pair_ld, add_kv,
                       dv_j, dkv_ld, depth_from_row);
              PairGemm(tiles, rows, keys, D, T(1), dout_row_pairs, d_pairs, 1, v_t_pairs_at(jb), kBlock, false, dprobs,
                       kBlock, columns);
            } else {
              BlockGemm(keys, D, rows, T(1), probs, 1, kBlock, dout_i, D, add_kv, dv_j, dkv_ld, depth_from_row);
              BlockGemm(rows, keys, D, T(1), dout_i, D, 1, v_t_j, kBlock, false, dprobs, kBlock, columns);
            }
            for (int64_t r = 0; r < rows; ++r)
              ScoreGradRow(probs + r * kBlock, dprobs + r * kBlock, diagonal ? ColumnsUpToRow(r, keys, lanes) : keys,
                           row_dot[r]);
            // dq += scale dS k; dk += scale dS^T q. In pairs each row of dS is paired up to the columns it
            // holds, which cover every k-pair of its group's causal range; pairing dS's columns may read
            // columns past them, which no product reads.
            if constexpr (kPairs) {
              for (int64_t r = 0; r < rows; ++r)
                row_to_pairs(dprobs + r * kBlock, diagonal ? ColumnsUpToRow(r, keys, lanes) : keys,
                             ds_row_pairs + r * kPairBlock);
              PairDownColumns(dprobs, kBlock, rows, keys, ds_column_pairs, kBlock);
              PairGemm(tiles, rows, D, keys, scale, ds_row_pairs, kPairBlock, 1, k_pairs_at(jb), d_pair_ld, add_q, dq_i,
                       dq_ld, depth_up_to_row);
              PairGemm(tiles, keys, D, rows, scale, ds_column_pairs, 1, kBlock, q_column_pairs, d_pair_ld, add_kv,
                       dk_j, dkv_ld, depth_from_row);
            } else {
              BlockGemm(rows, D, keys, scale, dprobs, kBlock, 1, k_rows + j0 * D, D, add_q, dq_i, dq_ld,
                        depth_up_to_row);
              BlockGemm(keys, D, rows, scale, dprobs, 1, kBlock, q_i, D, add_kv, dk_j, dkv_ld, depth_from_row);
            }
          }
          // The block's dq is whole once its last key block is in.
          if (rope.on()) ScatterRows(dq_sums, rows, D, dq + s.q_row(b, i0, h), s.q_ld, rope, i0);
        }
      }
      if (rope.on()) {
        ScatterRows(dk_sums, s.T, D, dk + s.kv_row(b, 0, kv), s.kv_ld, rope, 0);
        ScatterRows(dv_sums, s.T, D, dv + s.kv_row(b, 0, kv), s.kv_ld);
      }
    }
  });
}

// bf16_products: the caller asks for the bf16 block products, which run on f32 tensors where the CPU has
// AVX512_BF16 and this target instantiates them.
void AttentionKernel(DType dtype, const AttentionShape& s, const void* q, const void* k, const void* v, double scale,
                     void* out, void* lse, bool bf16_products) {
#if LT_ATTENTION_PAIRS
  if (bf16_products && dtype == DType::F32 && has_bf16_dot())
    return AttentionForwardT<float, true>(s, static_cast<const float*>(q), static_cast<const float*>(k),
                                          static_cast<const float*>(v), static_cast<float>(scale),
                                          static_cast<float*>(out), static_cast<float*>(lse));
#else
  (void)bf16_products;
#endif
  LT_FLOAT_SWITCH(dtype, T,
                  AttentionForwardT<T>(s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                       T(scale), static_cast<T*>(out), static_cast<T*>(lse)));
}

// The backward in f32 (T = float) on q, k, v and out of element type S, with the bf16 block products where
// they run (AttentionKernel).
template <class S>
void AttentionBackwardF32(const AttentionShape& s, const void* q, const void* k, const void* v, const void* out,
                          const void* lse, const void* dout, double scale, void* dq, void* dk, void* dv,
                          bool bf16_products) {
  const auto run = [&](auto pairs) {
    AttentionBackwardT<float, decltype(pairs)::value, S>(
        s, static_cast<const S*>(q), static_cast<const S*>(k), static_cast<const S*>(v), static_cast<const S*>(out),
        static_cast<const float*>(lse), static_cast<const float*>(dout), static_cast<float>(scale),
        static_cast<float*>(dq), static_cast<float*>(dk), static_cast<float*>(dv));
  };
#if LT_ATTENTION_PAIRS
  if (bf16_products && has_bf16_dot()) return run(std::true_type());
#else
  (void)bf16_products;
#endif
  run(std::false_type());
}

// kept_bf16: q, k, v and out are the bf16 copies autograd kept of f32 tensors (dtype: dout's, f32).
void AttentionBackwardKernel(DType dtype, const AttentionShape& s, const void* q, const void* k, const void* v,
                             const void* out, const void* lse, const void* dout, double scale, void* dq, void* dk,
                             void* dv, bool bf16_products, bool kept_bf16) {
  if (kept_bf16) return AttentionBackwardF32<uint16_t>(s, q, k, v, out, lse, dout, scale, dq, dk, dv, bf16_products);
  if (dtype == DType::F32)
    return AttentionBackwardF32<float>(s, q, k, v, out, lse, dout, scale, dq, dk, dv, bf16_products);
  LT_FLOAT_SWITCH(dtype, T,
                  AttentionBackwardT<T>(s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                        static_cast<const T*>(out), static_cast<const T*>(lse),
                                        static_cast<const T*>(dout), T(scale), static_cast<T*>(dq),
                                        static_cast<T*>(dk), static_cast<T*>(dv)));
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(AttentionKernel);
HWY_EXPORT(AttentionBackwardKernel);

namespace {

const int32_t* doc_start_data(const Tensor& doc_start) {
  return doc_start.defined() ? doc_start.data<int32_t>() : nullptr;
}

// Mixed precision asks for the bf16 block products (the kernels run them where the CPU has them).
bool bf16_products() { return kernels::matmul_precision() == kernels::MatmulPrecision::BF16Inputs; }

// q [B, T, Hq, D] and k, v [B, T, Hkv, D], compact and rotated.
AttentionShape compact_shape(const Tensor& q, const Tensor& k, const Tensor& doc_start) {
  const int64_t Hq = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  return {q.dim(0), q.dim(1), Hq, Hkv, D, Hq * D, Hkv * D, doc_start_data(doc_start), {}};
}

// The column blocks of a fused projection qkv [B, T, (Hq + 2 Hkv) D], q and k still to be turned by RoPE
// with tables in the element type the kernel computes in (`compute`: qkv's, or f32 where qkv is its kept
// bf16 copy), and the columns where k's and v's blocks begin.
struct FusedLayout {
  AttentionShape shape;
  int64_t k_column, v_column;
};
FusedLayout fused_layout(const Tensor& qkv, DType compute, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset,
                         const Tensor& doc_start) {
  const int64_t T = qkv.dim(1), C = qkv.dim(2), D = C / (Hq + 2 * Hkv);
  const AttentionShape shape{
      qkv.dim(0), T, Hq, Hkv, D, C, C, doc_start_data(doc_start), rope_tables(compute, pos_offset, T, D, theta)};
  return {shape, Hq * D, (Hq + Hkv) * D};
}

// Where column `column` of t's first row lies (a block of columns of a row-major tensor).
const void* column_at(const Tensor& t, int64_t column) {
  return static_cast<const char*>(t.raw_data()) + column * static_cast<int64_t>(dtype_size(t.dtype()));
}
void* column_at(Tensor& t, int64_t column) {
  return const_cast<void*>(column_at(static_cast<const Tensor&>(t), column));
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start) {
  if (q.numel() == 0) return;
  const AttentionShape shape = compact_shape(q, k, doc_start);
  HWY_DYNAMIC_DISPATCH(AttentionKernel)
  (q.dtype(), shape, q.raw_data(), k.raw_data(), v.raw_data(), scale, out.raw_data(), lse.raw_data(),
   bf16_products());
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) {
  if (q.numel() == 0 && k.numel() == 0) return;
  const AttentionShape shape = compact_shape(q, k, doc_start);
  HWY_DYNAMIC_DISPATCH(AttentionBackwardKernel)
  (dout.dtype(), shape, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(), dout.raw_data(),
   scale, dq.raw_data(), dk.raw_data(), dv.raw_data(), bf16_products(), q.dtype() == DType::BF16);
}

void qkv_attention(const Tensor& qkv, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start, const Tensor& qkv_bf16,
                   const Tensor& out_bf16) {
  if (qkv.numel() == 0) return;
  const FusedLayout layout = fused_layout(qkv, qkv.dtype(), Hq, Hkv, theta, pos_offset, doc_start);
  HWY_DYNAMIC_DISPATCH(AttentionKernel)
  (qkv.dtype(), layout.shape, qkv.raw_data(), column_at(qkv, layout.k_column), column_at(qkv, layout.v_column), scale,
   out.raw_data(), lse.raw_data(), bf16_products());
  // The kept copies (autograd/saved.h) in parallel passes of their own: rounding each block in the task
  // that reads or finishes it put the work on the tasks' critical path and was no faster.
  using Copy = std::pair<const Tensor*, Tensor>;
  for (auto [from, to] : {Copy{&qkv, qkv_bf16}, Copy{&out, out_bf16}})
    if (to.defined()) convert(*from, to);
}

void qkv_attention_backward(const Tensor& qkv, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start) {
  if (qkv.numel() == 0) return;
  const FusedLayout layout = fused_layout(qkv, dout.dtype(), Hq, Hkv, theta, pos_offset, doc_start);
  HWY_DYNAMIC_DISPATCH(AttentionBackwardKernel)
  (dout.dtype(), layout.shape, qkv.raw_data(), column_at(qkv, layout.k_column), column_at(qkv, layout.v_column),
   out.raw_data(), lse.raw_data(), dout.raw_data(), scale, dqkv.raw_data(), column_at(dqkv, layout.k_column),
   column_at(dqkv, layout.v_column), bf16_products(), qkv.dtype() == DType::BF16);
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
