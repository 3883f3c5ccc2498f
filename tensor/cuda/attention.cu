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
#include <cmath>
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/device_math.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

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

// D_i = rowsum(dout_i * out_i) for every (b, h, t), laid out like lse [B, Hq, T].
template <class T>
__global__ void attention_row_dot_kernel(const T* out, const T* dout, AttentionDims s, T* row_dot) {
  for (int64_t e = first_index(); e < s.B * s.Hq * s.T; e += grid_stride()) {
    const int64_t b = e / (s.Hq * s.T), h = (e / s.T) % s.Hq, t = e % s.T;
    const int64_t offset = row_offset(s, b, t, h, s.Hq);
    T dot = 0;
    for (int64_t c = 0; c < s.D; ++c) dot += dout[offset + c] * out[offset + c];
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

AttentionDims dims_of(const Tensor& q, const Tensor& k) { return {q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)}; }

const int32_t* doc_start_data(const Tensor& doc_start) {
  return doc_start.defined() ? doc_start.data<int32_t>() : nullptr;
}

template <class T>
dim3 tiles_grid(const AttentionDims& s, int64_t heads) {
  return dim3(static_cast<unsigned>((s.T + Tile<T>::kSize - 1) / Tile<T>::kSize), static_cast<unsigned>(s.B * heads));
}

// q [B, T, heads, D], k and v [B, T, kv_heads, D] split from a fused projection, q and k turned by RoPE.
struct SplitHeads {
  Tensor q, k, v;
};
SplitHeads split_heads(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (heads + 2 * kv_heads);
  SplitHeads split{Tensor::empty({B, T, heads, D}, qkv.dtype(), qkv.device()),
                   Tensor::empty({B, T, kv_heads, D}, qkv.dtype(), qkv.device()),
                   Tensor::empty({B, T, kv_heads, D}, qkv.dtype(), qkv.device())};
  split_qkv_rope(qkv, theta, pos_offset, split.q, split.k, split.v);
  return split;
}

}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start) {
  const AttentionDims s = dims_of(q, k);
  if (s.B * s.T * s.Hq == 0) return;
  const DeviceGuard guard(q.device().index);
  LT_FLOAT_SWITCH(q.dtype(), T, {
    constexpr int kTile = Tile<T>::kSize;
    LT_CUDA_LAUNCH(tiles_grid<T>(s, s.Hq), kTile * kTile, attention_forward_kernel<T>)(
        q.data<T>(), k.data<T>(), v.data<T>(), static_cast<T>(scale), doc_start_data(doc_start), s, out.data<T>(),
     lse.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) {
  const AttentionDims s = dims_of(q, k);
  if (s.B * s.T * s.Hq == 0) return;
  const DeviceGuard guard(q.device().index);
  Tensor row_dot = Tensor::empty(lse.shape(), lse.dtype(), lse.device());
  LT_FLOAT_SWITCH(q.dtype(), T, {
    constexpr int kTile = Tile<T>::kSize;
    const T t_scale = static_cast<T>(scale);
    LT_CUDA_LAUNCH(blocks_for(s.B * s.Hq * s.T), kThreadsPerBlock, attention_row_dot_kernel<T>)(
        out.data<T>(), dout.data<T>(), s, row_dot.data<T>());
    LT_CUDA_LAUNCH(tiles_grid<T>(s, s.Hq), kTile * kTile, attention_dq_kernel<T>)(
        q.data<T>(), k.data<T>(), v.data<T>(), lse.data<T>(), row_dot.data<T>(), dout.data<T>(), t_scale,
     doc_start_data(doc_start), s, dq.data<T>());
    LT_CUDA_LAUNCH(tiles_grid<T>(s, s.Hkv), kTile * kTile, attention_dkdv_kernel<T>)(
        q.data<T>(), k.data<T>(), v.data<T>(), lse.data<T>(), row_dot.data<T>(), dout.data<T>(), t_scale,
     doc_start_data(doc_start), s, dk.data<T>(), dv.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void qkv_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start) {
  const SplitHeads split = split_heads(qkv, heads, kv_heads, theta, pos_offset);
  attention(split.q, split.k, split.v, scale, out, lse, doc_start);
}

void qkv_attention_backward(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start) {
  const SplitHeads split = split_heads(qkv, heads, kv_heads, theta, pos_offset);
  Tensor dq = Tensor::empty_like(split.q), dk = Tensor::empty_like(split.k), dv = Tensor::empty_like(split.v);
  attention_backward(split.q, split.k, split.v, out, lse, dout, scale, dq, dk, dv, doc_start);
  split_qkv_rope_backward(dq, dk, dv, theta, pos_offset, dqkv);
}

}  // namespace lt::LT_CUDA_NAMESPACE
