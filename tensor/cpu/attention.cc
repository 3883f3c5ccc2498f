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
#include <utility>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/exp-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/rope-inl.h"
#include "tensor/cpu/transpose-inl.h"
#include "tensor/dtype_switch.h"
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

template <class T>
void BlockGemm(int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t a_row, int64_t a_col, const T* b,
               int64_t ldb, bool accumulate, T* c, int64_t ldc, Causal causal = Causal::kNone) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>()));
  for (int64_t m = 0; m < M; m += kGroupRows) {
    int64_t n = N, k_begin = 0, k_end = K;
    switch (causal) {
      case Causal::kNone: break;
      case Causal::kColumnsUpToRow: n = ColumnsUpToRow(m, N, lanes); break;
      case Causal::kDepthUpToRow: k_end = std::min(K, m + kGroupRows); break;
      case Causal::kDepthFromRow: k_begin = std::min(K, m); break;
    }
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
// the block has the bits a separate RoPE pass would have given).
template <class T>
void GatherRows(const T* src, int64_t ld, int64_t rows, int64_t D, T* dst, const Rope<T>& rope = {}, int64_t t0 = 0) {
  const int64_t half = D / 2;
  PrefetchRows(src, ld, std::min(rows, kRowsAhead), D);
  for (int64_t c = 0; c < rows; ++c) {
    if (c + kRowsAhead < rows) PrefetchRows(src + (c + kRowsAhead) * ld, ld, 1, D);
    if (rope.on())
      RotateHalf<false>(src + c * ld, dst + c * D, rope.cos + (t0 + c) * half, rope.sin + (t0 + c) * half, half);
    else
      std::copy_n(src + c * ld, D, dst + c * D);
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

// ---- row helpers ----------------------------------------------------------------------------------
template <class T>
T Dot(const T* x, const T* y, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = hn::MulAdd(hn::LoadU(d, x + i), hn::LoadU(d, y + i), acc);
  T sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += x[i] * y[i];
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
template <class T>
void AttentionForwardT(const AttentionShape& s, const T* q, const T* k, const T* v, T scale, T* out, T* lse) {
  const int64_t D = s.D, out_ld = s.Hq * D, blocks = BlockCount(s.T);
  const Rope<T> rope(s.rope);
  // Every query head of a group reads the same k and v blocks: pack them once per call rather than once
  // per task, k transposed block by block [B, Hkv, blocks, D, kBlock] and v contiguous [B, Hkv, T, D].
  // The storage comes from the caching allocator, so steady-state steps allocate nothing.
  const Tensor packed = Tensor::empty({s.B * s.Hkv * (blocks * D * kBlock + s.T * D)}, dtype_of<T>());
  T* k_blocks = packed.data<T>();
  T* v_rows = k_blocks + s.B * s.Hkv * blocks * D * kBlock;
  auto k_block_at = [&](int64_t b, int64_t kv, int64_t jb) {
    return k_blocks + ((b * s.Hkv + kv) * blocks + jb) * D * kBlock;
  };
  auto v_row_at = [&](int64_t b, int64_t kv, int64_t t) { return v_rows + ((b * s.Hkv + kv) * s.T + t) * D; };
  const ThreadScratch<T> pack_scratch(kBlock * D);
  parallel_for(s.B * s.Hkv * blocks, 1, [&](int64_t begin, int64_t end) {
    T* k_rotated = pack_scratch.mine();  // a key block turned by RoPE, before its transpose
    for (int64_t task = begin; task < end; ++task) {
      const int64_t jb = task % blocks, kv = task / blocks % s.Hkv, b = task / (blocks * s.Hkv);
      const int64_t j0 = jb * kBlock, keys = std::min(kBlock, s.T - j0);
      const auto [k_j, k_ld] = TurnedRows(k + s.kv_row(b, j0, kv), s.kv_ld, keys, D, rope, j0, k_rotated);
      PackTransposed(k_j, k_ld, keys, D, k_block_at(b, kv, jb));
      GatherRows(v + s.kv_row(b, j0, kv), s.kv_ld, keys, D, v_row_at(b, kv, j0));
    }
  });

  const ThreadScratch<T> block_scratch(kBlock * kBlock + 2 * kBlock + kBlock * D);
  parallel_for(s.B * s.Hq * blocks, 1, [&](int64_t begin, int64_t end) {
    T* scores = block_scratch.mine();
    T* row_max = scores + kBlock * kBlock;  // m per query row
    T* row_sum = row_max + kBlock;          // l per query row
    T* q_rotated = row_sum + kBlock;        // [kBlock, D]: the query block turned by RoPE
    T rescale[kBlock];
    int64_t lo[kBlock], hi[kBlock];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t ib = task % blocks, h = task / blocks % s.Hq, b = task / (blocks * s.Hq);
      const int64_t kv = h / s.group();
      const int64_t i0 = ib * kBlock, rows = std::min(kBlock, s.T - i0);
      const auto [q_i, q_i_ld] = TurnedRows(q + s.q_row(b, i0, h), s.q_ld, rows, D, rope, i0, q_rotated);
      T* acc = out + s.out_row(b, i0, h);  // the unnormalised output rows, summed in place (out_ld apart)
      std::fill(row_max, row_max + rows, -std::numeric_limits<T>::infinity());
      std::fill(row_sum, row_sum + rows, T(0));
      const int64_t first_jb = s.first_key(b, i0) / kBlock;
      for (int64_t jb = first_jb; jb <= ib; ++jb) {
        const int64_t j0 = jb * kBlock, keys = std::min(kBlock, s.T - j0);
        const bool diagonal = jb == ib, first = jb == first_jb;
        BlockGemm(rows, keys, D, scale, q_i, q_i_ld, 1, k_block_at(b, kv, jb), kBlock, false, scores, kBlock,
                  diagonal ? Causal::kColumnsUpToRow : Causal::kNone);
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
        BlockGemm(rows, D, keys, T(1), scores, kBlock, 1, v_row_at(b, kv, j0), D, !first, acc, out_ld,
                  diagonal ? Causal::kDepthUpToRow : Causal::kNone);
      }
      for (int64_t r = 0; r < rows; ++r) {
        ScaleRow(T(1) / row_sum[r], acc + r * out_ld, acc + r * out_ld, D);
        lse[s.lse_at(b, h, i0 + r)] = row_max[r] + std::log(row_sum[r]);
      }
    }
  });
}

// ---- backward ---------------------------------------------------------------------------------------
template <class T>
void AttentionBackwardT(const AttentionShape& s, const T* q, const T* k, const T* v, const T* out, const T* lse,
                        const T* dout, T scale, T* dq, T* dk, T* dv) {
  const int64_t D = s.D, out_ld = s.Hq * D, blocks = BlockCount(s.T), group = s.group();
  const Rope<T> rope(s.rope);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>()));
  const int64_t T_padded = blocks * kBlock;
  const int64_t sum_buffers = rope.on() ? 2 * T_padded * D + kBlock * D : 0;
  const ThreadScratch<T> task_scratch(2 * kBlock * kBlock + 3 * T_padded * D + 2 * kBlock * D + kBlock + sum_buffers);
  parallel_for(s.B * s.Hkv, 1, [&](int64_t begin, int64_t end) {
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
        PackTransposed(v + s.kv_row(b, j0, kv), s.kv_ld, keys, D, v_t + jb * D * kBlock);
      }
      // Each sum meets its terms in a fixed order (dk, dv of a key block: query head, then query block;
      // dq of a query block: key block), whatever the thread count.
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kv * group + g;
        for (int64_t ib = 0; ib < blocks; ++ib) {
          const int64_t i0 = ib * kBlock, rows = std::min(kBlock, s.T - i0);
          GatherRows(q + s.q_row(b, i0, h), s.q_ld, rows, D, q_i, rope, i0);
          GatherRows(dout + s.out_row(b, i0, h), out_ld, rows, D, dout_i);
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
            // S = scale q k^T, then P in place
            BlockGemm(rows, keys, D, scale, q_i, D, 1, k_t_j, kBlock, false, probs, kBlock, columns);
            VisibleRanges(s, b, i0, rows, ib, jb, keys, lo, hi);
            const T* lse_i = lse + s.lse_at(b, h, i0);
            T unused_sums[kSoftmaxRows];
            int64_t r = 0;
            for (; r + kSoftmaxRows <= rows; r += kSoftmaxRows)
              ExpRows<kSoftmaxRows>(TileRows<T>{probs + r * kBlock, lo + r, hi + r}, keys, lse_i + r, unused_sums);
            for (; r < rows; ++r)
              ExpRows<1>(TileRows<T>{probs + r * kBlock, lo + r, hi + r}, keys, lse_i + r, unused_sums);
            // dv += P^T dout
            BlockGemm(keys, D, rows, T(1), probs, 1, kBlock, dout_i, D, add_kv, dv_j, dkv_ld,
                      diagonal ? Causal::kDepthFromRow : Causal::kNone);
            // dP = dout v^T, then dS in place
            BlockGemm(rows, keys, D, T(1), dout_i, D, 1, v_t_j, kBlock, false, dprobs, kBlock, columns);
            for (int64_t r = 0; r < rows; ++r)
              ScoreGradRow(probs + r * kBlock, dprobs + r * kBlock, diagonal ? ColumnsUpToRow(r, keys, lanes) : keys,
                           row_dot[r]);
            // dq += scale dS k
            BlockGemm(rows, D, keys, scale, dprobs, kBlock, 1, k_rows + j0 * D, D, add_q, dq_i, dq_ld,
                      diagonal ? Causal::kDepthUpToRow : Causal::kNone);
            // dk += scale dS^T q
            BlockGemm(keys, D, rows, scale, dprobs, 1, kBlock, q_i, D, add_kv, dk_j, dkv_ld,
                      diagonal ? Causal::kDepthFromRow : Causal::kNone);
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

void AttentionKernel(DType dtype, const AttentionShape& s, const void* q, const void* k, const void* v, double scale,
                     void* out, void* lse) {
  LT_FLOAT_SWITCH(dtype, T,
                  AttentionForwardT<T>(s, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                                       T(scale), static_cast<T*>(out), static_cast<T*>(lse)));
}

void AttentionBackwardKernel(DType dtype, const AttentionShape& s, const void* q, const void* k, const void* v,
                             const void* out, const void* lse, const void* dout, double scale, void* dq, void* dk,
                             void* dv) {
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

// q [B, T, Hq, D] and k, v [B, T, Hkv, D], compact and rotated.
AttentionShape compact_shape(const Tensor& q, const Tensor& k, const Tensor& doc_start) {
  const int64_t Hq = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  return {q.dim(0), q.dim(1), Hq, Hkv, D, Hq * D, Hkv * D, doc_start_data(doc_start), {}};
}

// The column blocks of a fused projection qkv [B, T, (Hq + 2 Hkv) D], q and k still to be turned by RoPE,
// and the offsets of k's and v's blocks in a row, in bytes.
struct FusedLayout {
  AttentionShape shape;
  size_t k_offset, v_offset;
};
FusedLayout fused_layout(const Tensor& qkv, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset,
                         const Tensor& doc_start) {
  const int64_t T = qkv.dim(1), C = qkv.dim(2), D = C / (Hq + 2 * Hkv);
  const size_t element = dtype_size(qkv.dtype());
  const AttentionShape shape{
      qkv.dim(0), T, Hq, Hkv, D, C, C, doc_start_data(doc_start), rope_tables(qkv.dtype(), pos_offset, T, D, theta)};
  return {shape, static_cast<size_t>(Hq * D) * element, static_cast<size_t>((Hq + Hkv) * D) * element};
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start) {
  if (q.numel() == 0) return;
  const AttentionShape shape = compact_shape(q, k, doc_start);
  HWY_DYNAMIC_DISPATCH(AttentionKernel)
  (q.dtype(), shape, q.raw_data(), k.raw_data(), v.raw_data(), scale, out.raw_data(), lse.raw_data());
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) {
  if (q.numel() == 0 && k.numel() == 0) return;
  const AttentionShape shape = compact_shape(q, k, doc_start);
  HWY_DYNAMIC_DISPATCH(AttentionBackwardKernel)
  (q.dtype(), shape, q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(), dout.raw_data(), scale,
   dq.raw_data(), dk.raw_data(), dv.raw_data());
}

// The bf16 copies are a GPU's (the front door's check_kept refuses them here).
void qkv_attention(const Tensor& qkv, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start, const Tensor& /*qkv_bf16*/,
                   const Tensor& /*out_bf16*/) {
  if (qkv.numel() == 0) return;
  const FusedLayout layout = fused_layout(qkv, Hq, Hkv, theta, pos_offset, doc_start);
  const char* x = static_cast<const char*>(qkv.raw_data());
  HWY_DYNAMIC_DISPATCH(AttentionKernel)
  (qkv.dtype(), layout.shape, x, x + layout.k_offset, x + layout.v_offset, scale, out.raw_data(), lse.raw_data());
}

void qkv_attention_backward(const Tensor& qkv, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start) {
  if (qkv.numel() == 0) return;
  const FusedLayout layout = fused_layout(qkv, Hq, Hkv, theta, pos_offset, doc_start);
  const char* x = static_cast<const char*>(qkv.raw_data());
  char* dx = static_cast<char*>(dqkv.raw_data());
  HWY_DYNAMIC_DISPATCH(AttentionBackwardKernel)
  (qkv.dtype(), layout.shape, x, x + layout.k_offset, x + layout.v_offset, out.raw_data(), lse.raw_data(),
   dout.raw_data(), scale, dx, dx + layout.k_offset, dx + layout.v_offset);
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
