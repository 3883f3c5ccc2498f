// Causal grouped-query attention on the GPU, flash-style: forward and a deterministic backward, with
// the contract of kernels::attention (tensor/kernels.h) and the CPU kernel's algorithm
// (tensor/cpu/attention.cc) at a smaller tile.
//
// Tiles: kTile query rows by kTile keys (16 in f32, 8 in f64, so that every tile fits the 48 KiB of
// static shared memory for head dims up to kMaxHeadDim), one block of kTile x kTile threads. Thread
// (r, j) computes the score of query row r against key j of the tile; for the products with v, k or q
// it owns the output columns j, j + kTile, ... of row r. A row's kTile threads are consecutive lanes
// of one warp, so its maximum and sum are warp shuffles.
//
// Forward: one block per (batch, query head, query tile) streams the key tiles up to the diagonal with
// the online softmax: a running maximum m and sum l of exp(s - m) per row, the accumulator rescaled by
// exp(m_old - m_new) when m grows. Only a kTile x kTile tile of probabilities exists at a time.
// out = acc / l; lse = m + log(l) is kept for the backward.
//
// Backward (FlashAttention-2, probabilities recomputed as P = exp(s - lse); D_i = rowsum(dout_i out_i)):
//   dv = P^T dout,   dP = dout v^T,   dS = P (dP - D_i),   dq = scale dS k,   dk = scale dS^T q.
// Determinism without atomics: dq comes from blocks that own a query tile (and walk its key tiles), dk
// and dv from blocks that own a key tile of one kv head (and walk, in a fixed order, every query head
// that reads it and the query tiles that can see it). Each gradient element has one writer and a fixed
// order of additions, at the price of computing P twice.
//
// Document mask: with doc_start, query t of batch row b sees keys doc_start[b, t] .. t only. The starts
// never decrease along a row, so a query tile starts at the key tile of its first row's start, and a
// key tile's walk over query tiles stops at the first one whose first row starts after it.
//
// Numerics: scores, maxima and sums in the tensor's dtype, as on the CPU; the sums run in another order
// than the CPU's 64-wide blocks, so the two agree to rounding.
//
// Tensor cores: under mixed precision (kernels::matmul_precision() == BF16Inputs, --dtype bf16) f32
// attention takes other kernels with the same walks, grids of 64-row tiles and the same launches: the
// products on bf16 wmma fragments (16x16x16) with f32 accumulators. q, k, v and dout are rounded to
// bf16 (nearest even, f32_to_bf16) as they are loaded into shared memory, and D_i takes dout rounded
// alike; P (for P v and P^T dout) and dS (for dS k and dS^T q) are rounded to bf16 as operands; scores,
// maxima, sums and lse stay f32. A block is four warps of 16 rows each (64 query rows; 64 keys in the
// dk/dv kernel), walking steps of 32 keys (or 32 queries), everything in 48 KiB of static shared memory
// up to kMaxHeadDim. Results match the f32 kernel on bf16-rounded inputs to the rounding of P and dS
// (about 2^-9 relative); they are deterministic as the scalar kernels are (same ownership, fixed order,
// no atomics). The f32 default and f64 keep the scalar kernels above, exact to the CPU's rounding.
#include <cmath>
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for these
#include <cuda_bf16.h>
#include <mma.h>

#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype.h"
#include "tensor/dtype_switch.h"
#include "tensor/kernels.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// Rows and keys per tile, and the output columns each thread owns.
template <class T>
struct Tile {
  static constexpr int kSize = sizeof(T) == 4 ? 16 : 8;
  static constexpr int kColumnsPerThread = static_cast<int>(kMaxAttentionHeadDim) / kSize;
};

struct AttentionDims {
  int64_t B, T, Hq, Hkv, D;
  __host__ __device__ int64_t group() const { return Hq / Hkv; }
};

// The offset of row (b, t, head) of a [B, T, H, D] tensor.
__device__ inline int64_t row_offset(const AttentionDims& s, int64_t b, int64_t t, int64_t head, int64_t heads) {
  return ((b * s.T + t) * heads + head) * s.D;
}

// The maximum and the sum over the kTile consecutive lanes of a tile row (xor offsets below kTile stay
// inside an aligned group of kTile lanes). Every lane of the block takes part.
template <int kTile, class T>
__device__ inline T tile_row_max(T v) {
  for (int offset = kTile / 2; offset > 0; offset /= 2) {
    const T other = __shfl_xor_sync(0xffffffffu, v, static_cast<unsigned>(offset));
    v = v > other ? v : other;
  }
  return v;
}
template <int kTile, class T>
__device__ inline T tile_row_sum(T v) {
  for (int offset = kTile / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, static_cast<unsigned>(offset));
  return v;
}

// Rows [first, first + kTile) of one head of x [B, T, H, D] into tile (zeros past T).
template <int kTile, class T>
__device__ inline void load_tile(T (*tile)[kMaxAttentionHeadDim], const T* x, const AttentionDims& s, int64_t b,
                                 int64_t first, int64_t head, int64_t heads) {
  for (int64_t e = threadIdx.x; e < kTile * s.D; e += blockDim.x) {
    const int64_t row = e / s.D, c = e % s.D, t = first + row;
    tile[row][c] = t < s.T ? x[row_offset(s, b, t, head, heads) + c] : T(0);
  }
}

template <int kTile, class T>
__device__ inline T tile_dot(const T (*a)[kMaxAttentionHeadDim], int a_row, const T (*b)[kMaxAttentionHeadDim],
                             int b_row, int64_t D) {
  T dot = 0;
  for (int64_t c = 0; c < D; ++c) dot += a[a_row][c] * b[b_row][c];
  return dot;
}

// The first key query t of batch row b sees.
__device__ inline int64_t first_visible_key(const int32_t* doc_start, const AttentionDims& s, int64_t b, int64_t t) {
  return doc_start == nullptr ? 0 : static_cast<int64_t>(doc_start[b * s.T + t]);
}

// Where a block of the forward or dq kernel stands: thread (r, j) of a query tile of batch b and query
// head h (kv head h_kv), the tile's first query q0 and last one, this thread's query, whether that
// query exists (past T it does not) and the first key it sees.
template <int kTile>
struct QueryTile {
  int r, j;
  int64_t b, h, h_kv, q0, query, last_query, lo;
  bool live;
  __device__ QueryTile(const AttentionDims& s, const int32_t* doc_start)
      : r(static_cast<int>(threadIdx.x) / kTile),
        j(static_cast<int>(threadIdx.x) % kTile),
        b(blockIdx.y / s.Hq),
        h(blockIdx.y % s.Hq),
        h_kv(h / s.group()),
        q0(static_cast<int64_t>(blockIdx.x) * kTile),
        query(q0 + r),
        last_query((q0 + kTile < s.T ? q0 + kTile : s.T) - 1),
        lo(query < s.T ? first_visible_key(doc_start, s, b, query) : 0),
        live(query < s.T) {}
  // The first key tile any query of the tile sees (document starts never decrease along a row).
  __device__ int64_t first_key_tile(const AttentionDims& s, const int32_t* doc_start) const {
    return first_visible_key(doc_start, s, b, q0) / kTile * kTile;
  }
};

template <class T>
__global__ void attention_forward_kernel(const T* q, const T* k, const T* v, T scale, const int32_t* doc_start,
                                         AttentionDims s, T* out, T* lse) {
  constexpr int kTile = Tile<T>::kSize, kCols = Tile<T>::kColumnsPerThread;
  __shared__ T q_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T k_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T v_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T p_tile[kTile][kTile];
  const QueryTile<kTile> tile(s, doc_start);
  const int r = tile.r, j = tile.j;
  const int64_t b = tile.b, h = tile.h, h_kv = tile.h_kv, q0 = tile.q0, query = tile.query, lo = tile.lo;
  const bool live = tile.live;
  load_tile<kTile>(q_tile, q, s, b, q0, h, s.Hq);

  T m = -INFINITY, l = 0;
  T acc[kCols];
  for (int i = 0; i < kCols; ++i) acc[i] = 0;
  for (int64_t k0 = tile.first_key_tile(s, doc_start); k0 <= tile.last_query; k0 += kTile) {
    __syncthreads();  // the previous tile's reads of k, v and p are done
    load_tile<kTile>(k_tile, k, s, b, k0, h_kv, s.Hkv);
    load_tile<kTile>(v_tile, v, s, b, k0, h_kv, s.Hkv);
    __syncthreads();
    const int64_t key = k0 + j;
    const bool visible = live && key >= lo && key <= query;
    const T score = visible ? tile_dot<kTile>(q_tile, r, k_tile, j, s.D) * scale : T(-INFINITY);
    const T tile_max = tile_row_max<kTile>(score);
    const T m_new = m > tile_max ? m : tile_max;
    const T p = visible ? exponential(score - m_new) : T(0);
    const T rescale = m == T(-INFINITY) ? T(0) : exponential(m - m_new);  // nothing to rescale before a key
    l = l * rescale + tile_row_sum<kTile>(p);
    m = m_new;
    p_tile[r][j] = p;
    __syncthreads();
    for (int i = 0; i < kCols; ++i) {
      const int64_t c = j + static_cast<int64_t>(i) * kTile;
      if (c >= s.D) break;
      T sum = 0;
      for (int jj = 0; jj < kTile; ++jj) sum += p_tile[r][jj] * v_tile[jj][c];
      acc[i] = acc[i] * rescale + sum;
    }
  }
  if (!live) return;
  T* out_row = out + row_offset(s, b, query, h, s.Hq);
  for (int i = 0; i < kCols; ++i) {
    const int64_t c = j + static_cast<int64_t>(i) * kTile;
    if (c < s.D) out_row[c] = acc[i] / l;
  }
  if (j == 0) lse[(b * s.Hq + h) * s.T + query] = m + logarithm(l);
}

// D_i = rowsum(dout_i * out_i) for every (b, h, t), laid out like lse [B, Hq, T]. The tensor-core
// path takes dout as bf16, as its products dP = dout v^T do, so that D_i and dP agree. out as autograd
// kept it (KO: T, or its bf16 copy under mixed precision: kept_value).
template <class T, class KO, bool kBf16Dout>
__global__ void attention_row_dot_kernel(const KO* out, const T* dout, AttentionDims s, T* row_dot) {
  for (int64_t e = first_index(); e < s.B * s.Hq * s.T; e += grid_stride()) {
    const int64_t b = e / (s.Hq * s.T), h = (e / s.T) % s.Hq, t = e % s.T;
    const int64_t offset = row_offset(s, b, t, h, s.Hq);
    T dot = 0;
    for (int64_t c = 0; c < s.D; ++c) {
      const T d = kBf16Dout ? static_cast<T>(bf16_to_f32(f32_to_bf16(static_cast<float>(dout[offset + c]))))
                            : dout[offset + c];
      dot += d * kept_value<T>(out, offset + c);
    }
    row_dot[e] = dot;
  }
}

// dq for one (batch, query head, query tile), walking its key tiles as the forward does.
template <class T>
__global__ void attention_dq_kernel(const T* q, const T* k, const T* v, const T* lse, const T* row_dot, const T* dout,
                                    T scale, const int32_t* doc_start, AttentionDims s, T* dq) {
  constexpr int kTile = Tile<T>::kSize, kCols = Tile<T>::kColumnsPerThread;
  __shared__ T q_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T dout_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T k_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T v_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T ds_tile[kTile][kTile];
  const QueryTile<kTile> tile(s, doc_start);
  const int r = tile.r, j = tile.j;
  const int64_t b = tile.b, h = tile.h, h_kv = tile.h_kv, q0 = tile.q0, query = tile.query, lo = tile.lo;
  const bool live = tile.live;
  const int64_t stat = (b * s.Hq + h) * s.T + query;
  const T row_lse = live ? lse[stat] : T(0), row_d = live ? row_dot[stat] : T(0);
  load_tile<kTile>(q_tile, q, s, b, q0, h, s.Hq);
  load_tile<kTile>(dout_tile, dout, s, b, q0, h, s.Hq);

  T acc[kCols];
  for (int i = 0; i < kCols; ++i) acc[i] = 0;
  for (int64_t k0 = tile.first_key_tile(s, doc_start); k0 <= tile.last_query; k0 += kTile) {
    __syncthreads();
    load_tile<kTile>(k_tile, k, s, b, k0, h_kv, s.Hkv);
    load_tile<kTile>(v_tile, v, s, b, k0, h_kv, s.Hkv);
    __syncthreads();
    const int64_t key = k0 + j;
    const bool visible = live && key >= lo && key <= query;
    T ds = 0;
    if (visible) {
      const T p = exponential(tile_dot<kTile>(q_tile, r, k_tile, j, s.D) * scale - row_lse);
      ds = p * (tile_dot<kTile>(dout_tile, r, v_tile, j, s.D) - row_d);
    }
    ds_tile[r][j] = ds;
    __syncthreads();
    for (int i = 0; i < kCols; ++i) {
      const int64_t c = j + static_cast<int64_t>(i) * kTile;
      if (c >= s.D) break;
      for (int jj = 0; jj < kTile; ++jj) acc[i] += ds_tile[r][jj] * k_tile[jj][c];
    }
  }
  if (!live) return;
  T* dq_row = dq + row_offset(s, b, query, h, s.Hq);
  for (int i = 0; i < kCols; ++i) {
    const int64_t c = j + static_cast<int64_t>(i) * kTile;
    if (c < s.D) dq_row[c] = scale * acc[i];
  }
}

// dk and dv for one (batch, kv head, key tile): thread (r, j) is key r of the tile against query j of a
// query tile, and owns columns j, j + kTile, ... of key r's gradients.
template <class T>
__global__ void attention_dkdv_kernel(const T* q, const T* k, const T* v, const T* lse, const T* row_dot, const T* dout,
                                      T scale, const int32_t* doc_start, AttentionDims s, T* dk, T* dv) {
  constexpr int kTile = Tile<T>::kSize, kCols = Tile<T>::kColumnsPerThread;
  __shared__ T k_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T v_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T q_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T dout_tile[kTile][kMaxAttentionHeadDim];
  __shared__ T p_tile[kTile][kTile];
  __shared__ T ds_tile[kTile][kTile];
  __shared__ T lse_tile[kTile];
  __shared__ T row_dot_tile[kTile];
  const int r = static_cast<int>(threadIdx.x) / kTile, j = static_cast<int>(threadIdx.x) % kTile;
  const int64_t b = blockIdx.y / s.Hkv, h_kv = blockIdx.y % s.Hkv;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile, key = k0 + r;
  const int64_t last_key = (k0 + kTile < s.T ? k0 + kTile : s.T) - 1;
  load_tile<kTile>(k_tile, k, s, b, k0, h_kv, s.Hkv);
  load_tile<kTile>(v_tile, v, s, b, k0, h_kv, s.Hkv);

  T dk_acc[kCols], dv_acc[kCols];
  for (int i = 0; i < kCols; ++i) dk_acc[i] = dv_acc[i] = 0;
  for (int64_t h = h_kv * s.group(); h < (h_kv + 1) * s.group(); ++h)
    for (int64_t q0 = k0; q0 < s.T; q0 += kTile) {
      // Query rows only start later along the row: once a tile's first row starts after this key tile,
      // no later query sees it. (The same for every thread: the loop stays uniform across the block.)
      if (first_visible_key(doc_start, s, b, q0) > last_key) break;
      __syncthreads();  // the previous query tile's reads are done
      load_tile<kTile>(q_tile, q, s, b, q0, h, s.Hq);
      load_tile<kTile>(dout_tile, dout, s, b, q0, h, s.Hq);
      const int lane = static_cast<int>(threadIdx.x);
      if (lane < kTile) {
        const int64_t t = q0 + lane;
        lse_tile[lane] = t < s.T ? lse[(b * s.Hq + h) * s.T + t] : T(0);
        row_dot_tile[lane] = t < s.T ? row_dot[(b * s.Hq + h) * s.T + t] : T(0);
      }
      __syncthreads();
      const int64_t query = q0 + j;
      const bool visible = query < s.T && key <= query && key >= first_visible_key(doc_start, s, b, query);
      T p = 0, ds = 0;
      if (visible) {
        p = exponential(tile_dot<kTile>(q_tile, j, k_tile, r, s.D) * scale - lse_tile[j]);
        ds = p * (tile_dot<kTile>(dout_tile, j, v_tile, r, s.D) - row_dot_tile[j]);
      }
      p_tile[r][j] = p;
      ds_tile[r][j] = ds;
      __syncthreads();
      for (int i = 0; i < kCols; ++i) {
        const int64_t c = j + static_cast<int64_t>(i) * kTile;
        if (c >= s.D) break;
        for (int jj = 0; jj < kTile; ++jj) {
          dv_acc[i] += p_tile[r][jj] * dout_tile[jj][c];
          dk_acc[i] += ds_tile[r][jj] * q_tile[jj][c];
        }
      }
    }
  if (key >= s.T) return;
  T* dk_row = dk + row_offset(s, b, key, h_kv, s.Hkv);
  T* dv_row = dv + row_offset(s, b, key, h_kv, s.Hkv);
  for (int i = 0; i < kCols; ++i) {
    const int64_t c = j + static_cast<int64_t>(i) * kTile;
    if (c >= s.D) break;
    dk_row[c] = scale * dk_acc[i];
    dv_row[c] = dv_acc[i];
  }
}

// ---- The tensor-core path (MatmulPrecision::BF16Inputs, f32 tensors) ------------------------------------
//
// The same walks as above at 64-row tiles, the products on bf16 wmma fragments (16x16x16, f32
// accumulators): q, k, v and dout rounded to bf16 (f32_to_bf16, nearest even) as they enter shared
// memory, P and dS rounded to bf16 as operands of the second products; scores, maxima, sums and lse in
// f32. The four warps of a block own 16 rows each (query rows, or key rows in the dk/dv kernel), and
// their own operand (q, or k and v) sits in register fragments for the whole walk: loaded once through
// shared memory, which the walk's tiles then reuse. The row statistics are taken from scores stored to
// shared memory (the layout of an accumulator fragment is unspecified): lane l of a warp owns row l / 2,
// its half l % 2 of the tile's columns, and the same half of each 16-column chunk of the output (the
// forward's accumulator, which its rescaling needs by row, lives in those lanes' registers).

namespace wmma = nvcuda::wmma;

constexpr int kMma = 16;                                           // the side of a wmma tile
constexpr int kTcWarps = 4;
constexpr int kTcThreads = kTcWarps * 32;
constexpr int kTcRows = kTcWarps * kMma;                           // the rows a block owns
constexpr int kTcStep = 32;                                        // keys (or queries) per step of a walk
constexpr int kTcChunks = static_cast<int>(kMaxAttentionHeadDim) / kMma;  // 16-column chunks of a head
// Row strides in shared memory: bf16 head rows padded by 16 bytes, so that the 16 rows a fragment reads
// fall on different banks; f32 score rows unpadded; bf16 probability rows padded likewise.
constexpr int kHeadStride = static_cast<int>(kMaxAttentionHeadDim) + 8;
constexpr int kStepStride = kTcStep + 8;
constexpr int kLaneColumns = kMma / 2;  // of each 16-column output chunk, per lane

using OperandA = wmma::fragment<wmma::matrix_a, kMma, kMma, kMma, __nv_bfloat16, wmma::row_major>;
using OperandB = wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __nv_bfloat16, wmma::row_major>;
using OperandBt = wmma::fragment<wmma::matrix_b, kMma, kMma, kMma, __nv_bfloat16, wmma::col_major>;
using Accumulator = wmma::fragment<wmma::accumulator, kMma, kMma, kMma, float>;

// bf16 tiles are written as bits (f32_to_bf16) and read by wmma as __nv_bfloat16: the same two bytes.
__device__ inline const __nv_bfloat16* as_bf16(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

// Where a thread stands in its warp: the row (of the warp's 16) and the half of the columns it owns.
struct WarpLane {
  int warp, row, half;
  __device__ WarpLane()
      : warp(static_cast<int>(threadIdx.x) / 32),
        row(static_cast<int>(threadIdx.x) % 32 / 2),
        half(static_cast<int>(threadIdx.x) % 2) {}
};

// The head dim in 16-column chunks: columns past D are loaded as zeros and never written back.
__device__ inline int head_chunks(const AttentionDims& s) { return static_cast<int>((s.D + kMma - 1) / kMma); }

// Rows [first, first + rows) of one head of x [B, T, H, D] into tile as bf16 (zeros past T and D). x
// as autograd kept it (K: f32, or its bf16 copy under mixed precision: kept_value), the same bits either
// way, since rounding a widened bf16 value to bf16 gives it back.
template <class K>
__device__ inline void load_bf16_tile(uint16_t (*tile)[kHeadStride], int rows, const K* x, const AttentionDims& s,
                                      int64_t b, int64_t first, int64_t head, int64_t heads) {
  const int64_t columns = head_chunks(s) * kMma;
  for (int64_t e = threadIdx.x; e < rows * columns; e += blockDim.x) {
    const int64_t row = e / columns, c = e % columns, t = first + row;
    tile[row][c] =
        f32_to_bf16(t < s.T && c < s.D ? kept_value<float>(x, row_offset(s, b, t, head, heads) + c) : 0.0f);
  }
}

// The 16 rows of a tile from `rows` on as matrix_a fragments, one per 16-column chunk.
__device__ inline void load_row_fragments(OperandA (&fragments)[kTcChunks], const uint16_t (*rows)[kHeadStride],
                                          int chunks) {
  for (int c = 0; c < kTcChunks; ++c)
    if (c < chunks) wmma::load_matrix_sync(fragments[c], as_bf16(&rows[0][c * kMma]), kHeadStride);
}

// out [16, kTcStep] (f32, row stride kTcStep) = a [16, D] times the kTcStep rows of `rows` transposed.
__device__ inline void warp_products_transposed(const OperandA (&a)[kTcChunks], int chunks,
                                                const uint16_t (*rows)[kHeadStride], float* out) {
  for (int n = 0; n < kTcStep / kMma; ++n) {
    Accumulator sum;
    wmma::fill_fragment(sum, 0.0f);
    for (int c = 0; c < kTcChunks; ++c) {
      if (c >= chunks) continue;
      OperandBt b;
      wmma::load_matrix_sync(b, as_bf16(&rows[n * kMma][c * kMma]), kHeadStride);
      wmma::mma_sync(sum, a[c], b, sum);
    }
    wmma::store_matrix_sync(out + n * kMma, sum, kTcStep, wmma::mem_row_major);
  }
}

// The 16 rows of a [16, kTcStep] bf16 tile (P or dS) as matrix_a fragments, one per 16 columns.
__device__ inline void load_step_fragments(OperandA (&fragments)[kTcStep / kMma], const uint16_t (*rows)[kStepStride]) {
  for (int kk = 0; kk < kTcStep / kMma; ++kk)
    wmma::load_matrix_sync(fragments[kk], as_bf16(&rows[0][kk * kMma]), kStepStride);
}

// acc[c] += a [16, kTcStep] (bf16, row stride kStepStride) times columns [16 c, 16 c + 16) of the
// kTcStep rows of `rows`.
__device__ inline void warp_accumulate(Accumulator (&acc)[kTcChunks], int chunks, const uint16_t (*a)[kStepStride],
                                       const uint16_t (*rows)[kHeadStride]) {
  OperandA a_fragments[kTcStep / kMma];
  load_step_fragments(a_fragments, a);
  for (int c = 0; c < kTcChunks; ++c) {
    if (c >= chunks) continue;
    for (int kk = 0; kk < kTcStep / kMma; ++kk) {
      OperandB b;
      wmma::load_matrix_sync(b, as_bf16(&rows[kk * kMma][c * kMma]), kHeadStride);
      wmma::mma_sync(acc[c], a_fragments[kk], b, acc[c]);
    }
  }
}

// factor * acc into the warp's 16 rows (first_row on) of one head of x [B, T, H, D], rows past T and
// columns past D left out, through `scratch` (16 x 16 f32 of the warp's own).
__device__ inline void write_warp_rows(const Accumulator (&acc)[kTcChunks], float factor, float* scratch, float* x,
                                       const AttentionDims& s, int64_t b, int64_t first_row, int64_t head,
                                       int64_t heads) {
  const WarpLane me;
  const int64_t t = first_row + me.row;
  for (int c = 0; c < kTcChunks; ++c) {
    if (c >= head_chunks(s)) continue;
    wmma::store_matrix_sync(scratch, acc[c], kMma, wmma::mem_row_major);
    __syncwarp();
    for (int i = 0; i < kLaneColumns; ++i) {
      const int column = me.half * kLaneColumns + i;
      const int64_t d = c * kMma + column;
      if (t < s.T && d < s.D) x[row_offset(s, b, t, head, heads) + d] = factor * scratch[me.row * kMma + column];
    }
    __syncwarp();  // read before the next chunk's store
  }
}

// Shared memory of the forward: q staged for the fragments, then the walk's tiles in its place.
union alignas(128) ForwardShared {
  uint16_t q[kTcRows][kHeadStride];
  struct {
    uint16_t k[kTcStep][kHeadStride], v[kTcStep][kHeadStride];
    float scores[kTcRows][kTcStep];  // each warp's 16 rows; then the scratch of its P v chunks
    uint16_t p[kTcRows][kStepStride];
  } walk;
};

// out16, where not null, receives out rounded to bf16: the copy autograd keeps.
__global__ void attention_forward_tc_kernel(const float* q, const float* k, const float* v, float scale,
                                            const int32_t* doc_start, AttentionDims s, float* out, float* lse,
                                            uint16_t* out16) {
  __shared__ ForwardShared shared;
  const WarpLane me;
  const int64_t b = blockIdx.y / s.Hq, h = blockIdx.y % s.Hq, h_kv = h / s.group();
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTcRows, warp_q0 = q0 + me.warp * kMma;
  const int64_t query = warp_q0 + me.row, last_query = (q0 + kTcRows < s.T ? q0 + kTcRows : s.T) - 1;
  const bool live = query < s.T;
  const int64_t lo = live ? first_visible_key(doc_start, s, b, query) : 0;
  const int chunks = head_chunks(s);
  float* scores = &shared.walk.scores[me.warp * kMma][0];
  uint16_t (*p)[kStepStride] = &shared.walk.p[me.warp * kMma];

  load_bf16_tile(shared.q, kTcRows, q, s, b, q0, h, s.Hq);
  __syncthreads();
  OperandA q_rows[kTcChunks];
  load_row_fragments(q_rows, &shared.q[me.warp * kMma], chunks);

  float m = -INFINITY, l = 0;
  float acc[kTcChunks][kLaneColumns] = {};
  for (int64_t k0 = first_visible_key(doc_start, s, b, q0) / kTcStep * kTcStep; k0 <= last_query; k0 += kTcStep) {
    __syncthreads();  // every warp's reads of q (the first time), k and v are done
    load_bf16_tile(shared.walk.k, kTcStep, k, s, b, k0, h_kv, s.Hkv);
    load_bf16_tile(shared.walk.v, kTcStep, v, s, b, k0, h_kv, s.Hkv);
    __syncthreads();
    warp_products_transposed(q_rows, chunks, shared.walk.k, scores);
    __syncwarp();
    constexpr int kLaneKeys = kTcStep / 2;
    float score[kLaneKeys];
    float tile_max = -INFINITY;
    for (int j = 0; j < kLaneKeys; ++j) {
      const int column = me.half * kLaneKeys + j;
      const int64_t key = k0 + column;
      score[j] = live && key >= lo && key <= query ? scores[me.row * kTcStep + column] * scale : -INFINITY;
      tile_max = tile_max > score[j] ? tile_max : score[j];
    }
    const float other_max = __shfl_xor_sync(0xffffffffu, tile_max, 1u);
    tile_max = tile_max > other_max ? tile_max : other_max;
    const float m_new = m > tile_max ? m : tile_max;
    const float rescale = m == -INFINITY ? 0.0f : exponential(m - m_new);  // nothing to rescale before a key
    float sum = 0;
    for (int j = 0; j < kLaneKeys; ++j) {
      const float p_j = score[j] == -INFINITY ? 0.0f : exponential(score[j] - m_new);
      sum += p_j;
      p[me.row][me.half * kLaneKeys + j] = f32_to_bf16(p_j);
    }
    l = l * rescale + sum + __shfl_xor_sync(0xffffffffu, sum, 1u);
    m = m_new;
    __syncwarp();  // P is written and the scores read: their rows become the scratch of P v
    OperandA p_fragments[kTcStep / kMma];
    load_step_fragments(p_fragments, p);
    for (int c = 0; c < kTcChunks; ++c) {
      if (c >= chunks) continue;
      Accumulator pv;
      wmma::fill_fragment(pv, 0.0f);
      for (int kk = 0; kk < kTcStep / kMma; ++kk) {
        OperandB v_fragment;
        wmma::load_matrix_sync(v_fragment, as_bf16(&shared.walk.v[kk * kMma][c * kMma]), kHeadStride);
        wmma::mma_sync(pv, p_fragments[kk], v_fragment, pv);
      }
      wmma::store_matrix_sync(scores, pv, kMma, wmma::mem_row_major);
      __syncwarp();
      for (int i = 0; i < kLaneColumns; ++i)
        acc[c][i] = acc[c][i] * rescale + scores[me.row * kMma + me.half * kLaneColumns + i];
      __syncwarp();  // read before the next chunk's store
    }
  }
  if (!live) return;
  const int64_t out_offset = row_offset(s, b, query, h, s.Hq);
  for (int c = 0; c < kTcChunks; ++c)
    for (int i = 0; i < kLaneColumns; ++i) {
      const int64_t d = c * kMma + me.half * kLaneColumns + i;
      if (d >= s.D) continue;
      const float value = acc[c][i] / l;
      out[out_offset + d] = value;
      if (out16 != nullptr) out16[out_offset + d] = f32_to_bf16(value);
    }
  if (me.half == 0) lse[(b * s.Hq + h) * s.T + query] = m + logarithm(l);
}

// Shared memory of the dq kernel: q and dout staged for the fragments, then the walk's tiles.
union alignas(128) DqShared {
  struct {
    uint16_t q[kTcRows][kHeadStride], dout[kTcRows][kHeadStride];
  } staged;
  struct {
    uint16_t k[kTcStep][kHeadStride], v[kTcStep][kHeadStride];
    float scores[kTcRows][kTcStep], dp[kTcRows][kTcStep];  // scores: the scratch of the last write too
    uint16_t ds[kTcRows][kStepStride];
  } walk;
};

// q, k and v as autograd kept them (K: load_bf16_tile).
template <class K>
__global__ void attention_dq_tc_kernel(const K* q, const K* k, const K* v, const float* lse,
                                       const float* row_dot, const float* dout, float scale, const int32_t* doc_start,
                                       AttentionDims s, float* dq) {
  __shared__ DqShared shared;
  const WarpLane me;
  const int64_t b = blockIdx.y / s.Hq, h = blockIdx.y % s.Hq, h_kv = h / s.group();
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTcRows, warp_q0 = q0 + me.warp * kMma;
  const int64_t query = warp_q0 + me.row, last_query = (q0 + kTcRows < s.T ? q0 + kTcRows : s.T) - 1;
  const bool live = query < s.T;
  const int64_t lo = live ? first_visible_key(doc_start, s, b, query) : 0;
  const int64_t stat = (b * s.Hq + h) * s.T + query;
  const float row_lse = live ? lse[stat] : 0.0f, row_d = live ? row_dot[stat] : 0.0f;
  const int chunks = head_chunks(s);
  float* scores = &shared.walk.scores[me.warp * kMma][0];
  float* dp = &shared.walk.dp[me.warp * kMma][0];
  uint16_t (*ds)[kStepStride] = &shared.walk.ds[me.warp * kMma];

  load_bf16_tile(shared.staged.q, kTcRows, q, s, b, q0, h, s.Hq);
  load_bf16_tile(shared.staged.dout, kTcRows, dout, s, b, q0, h, s.Hq);
  __syncthreads();
  OperandA q_rows[kTcChunks], dout_rows[kTcChunks];
  load_row_fragments(q_rows, &shared.staged.q[me.warp * kMma], chunks);
  load_row_fragments(dout_rows, &shared.staged.dout[me.warp * kMma], chunks);

  Accumulator acc[kTcChunks];
  for (Accumulator& a : acc) wmma::fill_fragment(a, 0.0f);
  for (int64_t k0 = first_visible_key(doc_start, s, b, q0) / kTcStep * kTcStep; k0 <= last_query; k0 += kTcStep) {
    __syncthreads();  // every warp's reads of the staged rows (the first time), k and v are done
    load_bf16_tile(shared.walk.k, kTcStep, k, s, b, k0, h_kv, s.Hkv);
    load_bf16_tile(shared.walk.v, kTcStep, v, s, b, k0, h_kv, s.Hkv);
    __syncthreads();
    warp_products_transposed(q_rows, chunks, shared.walk.k, scores);
    warp_products_transposed(dout_rows, chunks, shared.walk.v, dp);
    __syncwarp();
    for (int j = 0; j < kTcStep / 2; ++j) {
      const int column = me.half * (kTcStep / 2) + j;
      const int64_t key = k0 + column;
      float ds_j = 0;
      if (live && key >= lo && key <= query) {
        const int at = me.row * kTcStep + column;
        ds_j = exponential(scores[at] * scale - row_lse) * (dp[at] - row_d);
      }
      ds[me.row][column] = f32_to_bf16(ds_j);
    }
    __syncwarp();
    warp_accumulate(acc, chunks, ds, shared.walk.k);
  }
  write_warp_rows(acc, scale, scores, dq, s, b, warp_q0, h, s.Hq);
}

// Shared memory of the dk/dv kernel: k and v staged for the fragments, then the walk's tiles (of
// kTcStep queries against the block's keys, transposed: key rows by query columns).
union alignas(128) DkDvShared {
  struct {
    uint16_t k[kTcRows][kHeadStride], v[kTcRows][kHeadStride];
  } staged;
  struct {
    uint16_t q[kTcStep][kHeadStride], dout[kTcStep][kHeadStride];
    float scores[kTcRows][kTcStep], dp[kTcRows][kTcStep];  // scores: the scratch of the last writes too
    uint16_t p[kTcRows][kStepStride], ds[kTcRows][kStepStride];
    float lse[kTcStep], row_dot[kTcStep];
  } walk;
};

// q, k and v as autograd kept them (K: load_bf16_tile).
template <class K>
__global__ void attention_dkdv_tc_kernel(const K* q, const K* k, const K* v, const float* lse,
                                         const float* row_dot, const float* dout, float scale,
                                         const int32_t* doc_start, AttentionDims s, float* dk, float* dv) {
  __shared__ DkDvShared shared;
  const WarpLane me;
  const int64_t b = blockIdx.y / s.Hkv, h_kv = blockIdx.y % s.Hkv;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTcRows, warp_k0 = k0 + me.warp * kMma;
  const int64_t key = warp_k0 + me.row, last_key = (k0 + kTcRows < s.T ? k0 + kTcRows : s.T) - 1;
  const int chunks = head_chunks(s);
  float* scores = &shared.walk.scores[me.warp * kMma][0];
  float* dp = &shared.walk.dp[me.warp * kMma][0];
  uint16_t (*p)[kStepStride] = &shared.walk.p[me.warp * kMma];
  uint16_t (*ds)[kStepStride] = &shared.walk.ds[me.warp * kMma];

  load_bf16_tile(shared.staged.k, kTcRows, k, s, b, k0, h_kv, s.Hkv);
  load_bf16_tile(shared.staged.v, kTcRows, v, s, b, k0, h_kv, s.Hkv);
  __syncthreads();
  OperandA k_rows[kTcChunks], v_rows[kTcChunks];
  load_row_fragments(k_rows, &shared.staged.k[me.warp * kMma], chunks);
  load_row_fragments(v_rows, &shared.staged.v[me.warp * kMma], chunks);

  Accumulator dk_acc[kTcChunks], dv_acc[kTcChunks];
  for (int c = 0; c < kTcChunks; ++c) {
    wmma::fill_fragment(dk_acc[c], 0.0f);
    wmma::fill_fragment(dv_acc[c], 0.0f);
  }
  for (int64_t h = h_kv * s.group(); h < (h_kv + 1) * s.group(); ++h)
    for (int64_t q0 = k0; q0 < s.T; q0 += kTcStep) {
      // As in the scalar kernel: once a step's first query starts after this key tile, no later one
      // sees it (the same for every thread: the loop stays uniform across the block).
      if (first_visible_key(doc_start, s, b, q0) > last_key) break;
      __syncthreads();  // every warp's reads of the staged rows (the first time) and of the last step are done
      load_bf16_tile(shared.walk.q, kTcStep, q, s, b, q0, h, s.Hq);
      load_bf16_tile(shared.walk.dout, kTcStep, dout, s, b, q0, h, s.Hq);
      if (threadIdx.x < kTcStep) {
        const int64_t t = q0 + threadIdx.x;
        shared.walk.lse[threadIdx.x] = t < s.T ? lse[(b * s.Hq + h) * s.T + t] : 0.0f;
        shared.walk.row_dot[threadIdx.x] = t < s.T ? row_dot[(b * s.Hq + h) * s.T + t] : 0.0f;
      }
      __syncthreads();
      warp_products_transposed(k_rows, chunks, shared.walk.q, scores);
      warp_products_transposed(v_rows, chunks, shared.walk.dout, dp);
      __syncwarp();
      for (int j = 0; j < kTcStep / 2; ++j) {
        const int column = me.half * (kTcStep / 2) + j;
        const int64_t query = q0 + column;
        float p_j = 0, ds_j = 0;
        if (query < s.T && key <= query && key >= first_visible_key(doc_start, s, b, query)) {
          const int at = me.row * kTcStep + column;
          p_j = exponential(scores[at] * scale - shared.walk.lse[column]);
          ds_j = p_j * (dp[at] - shared.walk.row_dot[column]);
        }
        p[me.row][column] = f32_to_bf16(p_j);
        ds[me.row][column] = f32_to_bf16(ds_j);
      }
      __syncwarp();
      warp_accumulate(dv_acc, chunks, p, shared.walk.dout);
      warp_accumulate(dk_acc, chunks, ds, shared.walk.q);
    }
  write_warp_rows(dk_acc, scale, scores, dk, s, b, warp_k0, h_kv, s.Hkv);
  write_warp_rows(dv_acc, 1.0f, scores, dv, s, b, warp_k0, h_kv, s.Hkv);
}

AttentionDims dims_of(const Tensor& q, const Tensor& k) { return {q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)}; }

const int32_t* doc_start_data(const Tensor& doc_start) {
  return doc_start.defined() ? doc_start.data<int32_t>() : nullptr;
}

template <class T>
dim3 tiles_grid(const AttentionDims& s, int64_t heads) {
  return dim3(static_cast<unsigned>((s.T + Tile<T>::kSize - 1) / Tile<T>::kSize), static_cast<unsigned>(s.B * heads));
}

// The tensor-core kernels serve f32 tensors under mixed precision (--dtype bf16); f32 otherwise and
// f64 always take the scalar ones, exact to the CPU's rounding. x: q in the forward, dout in the backward
// (whose q, k, v and out may be kept bf16 copies: the kernels.def contract).
bool on_tensor_cores(const Tensor& x) {
  return x.dtype() == DType::F32 && kernels::matmul_precision() == kernels::MatmulPrecision::BF16Inputs;
}

dim3 tensor_core_grid(const AttentionDims& s, int64_t heads) {
  return dim3(static_cast<unsigned>((s.T + kTcRows - 1) / kTcRows), static_cast<unsigned>(s.B * heads));
}

// q [B, T, heads, D], k and v [B, T, kv_heads, D] of `dtype` split from a fused projection, q and k
// turned by RoPE. The backward's qkv may be a kept bf16 copy, split into f32 (split_qkv_rope widens it as
// it reads).
struct SplitHeads {
  Tensor q, k, v;
};
SplitHeads split_heads(const Tensor& qkv, DType dtype, int64_t heads, int64_t kv_heads, double theta,
                       int64_t pos_offset, const Tensor& qkv_bf16 = Tensor()) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (heads + 2 * kv_heads);
  SplitHeads split{Tensor::empty({B, T, heads, D}, dtype, qkv.device()),
                   Tensor::empty({B, T, kv_heads, D}, dtype, qkv.device()),
                   Tensor::empty({B, T, kv_heads, D}, dtype, qkv.device())};
  split_qkv_rope_keeping(qkv, theta, pos_offset, split.q, split.k, split.v, qkv_bf16);
  return split;
}

// The forward, out_bf16 (where defined) receiving out's kept copy: only under mixed precision, where the
// tensor-core kernel runs.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
                       const Tensor& doc_start, const Tensor& out_bf16) {
  const AttentionDims s = dims_of(q, k);
  if (s.B * s.T * s.Hq == 0) return;
  const DeviceGuard guard(q.device().index);
  if (on_tensor_cores(q)) {
    LT_CUDA_LAUNCH(tensor_core_grid(s, s.Hq), kTcThreads, attention_forward_tc_kernel)(
        q.data<float>(), k.data<float>(), v.data<float>(), static_cast<float>(scale), doc_start_data(doc_start), s,
        out.data<float>(), lse.data<float>(), out_bf16.defined() ? out_bf16.bf16_data() : nullptr);
  } else {
    LT_CHECK(!out_bf16.defined(), "attention: a kept bf16 copy of out outside mixed precision");
    LT_FLOAT_SWITCH(q.dtype(), T, {
      constexpr int kTile = Tile<T>::kSize;
      LT_CUDA_LAUNCH(tiles_grid<T>(s, s.Hq), kTile * kTile, attention_forward_kernel<T>)(
          q.data<T>(), k.data<T>(), v.data<T>(), static_cast<T>(scale), doc_start_data(doc_start), s, out.data<T>(),
          lse.data<T>());
    });
  }
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start) {
  attention_forward(q, k, v, scale, out, lse, doc_start, Tensor());
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) {
  const AttentionDims s = dims_of(q, k);
  if (s.B * s.T * s.Hq == 0) return;
  const DeviceGuard guard(dout.device().index);
  Tensor row_dot = Tensor::empty(lse.shape(), lse.dtype(), lse.device());
  if (on_tensor_cores(dout)) {
    const float f_scale = static_cast<float>(scale);
    LT_KEPT_SWITCH(out, float, KO, {
      LT_CUDA_LAUNCH(blocks_for(s.B * s.Hq * s.T), kThreadsPerBlock, attention_row_dot_kernel<float, KO, true>)(
          static_cast<const KO*>(out.raw_data()), dout.data<float>(), s, row_dot.data<float>());
    });
    LT_KEPT_SWITCH(q, float, K, {
      const K *q_kept = static_cast<const K*>(q.raw_data()), *k_kept = static_cast<const K*>(k.raw_data()),
              *v_kept = static_cast<const K*>(v.raw_data());
      LT_CUDA_LAUNCH(tensor_core_grid(s, s.Hq), kTcThreads, attention_dq_tc_kernel<K>)(
          q_kept, k_kept, v_kept, lse.data<float>(), row_dot.data<float>(), dout.data<float>(), f_scale,
          doc_start_data(doc_start), s, dq.data<float>());
      LT_CUDA_LAUNCH(tensor_core_grid(s, s.Hkv), kTcThreads, attention_dkdv_tc_kernel<K>)(
          q_kept, k_kept, v_kept, lse.data<float>(), row_dot.data<float>(), dout.data<float>(), f_scale,
          doc_start_data(doc_start), s, dk.data<float>(), dv.data<float>());
    });
  } else {
    LT_FLOAT_SWITCH(q.dtype(), T, {
      constexpr int kTile = Tile<T>::kSize;
      const T t_scale = static_cast<T>(scale);
      LT_CUDA_LAUNCH(blocks_for(s.B * s.Hq * s.T), kThreadsPerBlock, attention_row_dot_kernel<T, T, false>)(
          out.data<T>(), dout.data<T>(), s, row_dot.data<T>());
      LT_CUDA_LAUNCH(tiles_grid<T>(s, s.Hq), kTile * kTile, attention_dq_kernel<T>)(
          q.data<T>(), k.data<T>(), v.data<T>(), lse.data<T>(), row_dot.data<T>(), dout.data<T>(), t_scale,
          doc_start_data(doc_start), s, dq.data<T>());
      LT_CUDA_LAUNCH(tiles_grid<T>(s, s.Hkv), kTile * kTile, attention_dkdv_kernel<T>)(
          q.data<T>(), k.data<T>(), v.data<T>(), lse.data<T>(), row_dot.data<T>(), dout.data<T>(), t_scale,
          doc_start_data(doc_start), s, dk.data<T>(), dv.data<T>());
    });
  }
  LT_CUDA_CHECK(cudaGetLastError());
}

void qkv_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start, const Tensor& qkv_bf16, const Tensor& out_bf16) {
  const SplitHeads split = split_heads(qkv, qkv.dtype(), heads, kv_heads, theta, pos_offset, qkv_bf16);
  attention_forward(split.q, split.k, split.v, scale, out, lse, doc_start, out_bf16);
}

void qkv_attention_backward(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start) {
  const SplitHeads split = split_heads(qkv, dout.dtype(), heads, kv_heads, theta, pos_offset);
  Tensor dq = Tensor::empty_like(split.q), dk = Tensor::empty_like(split.k), dv = Tensor::empty_like(split.v);
  attention_backward(split.q, split.k, split.v, out, lse, dout, scale, dq, dk, dv, doc_start);
  split_qkv_rope_backward(dq, dk, dv, theta, pos_offset, dqkv);
}

}  // namespace lt::LT_CUDA_NAMESPACE
