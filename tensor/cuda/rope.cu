// Rotary position embedding on the GPU, rotate-half (NeoX) convention, and its inverse (the backward),
// on compact [B, T, H, D] tensors or on the head blocks of a fused QKV projection's rows, with the CPU
// kernels' numerics (tensor/cpu/rope.cc):
//   y[i] = a[i] cos - b[i] sin,   y[i + D/2] = b[i] cos + a[i] sin   (a, b the halves of a head vector),
// each output one fused multiply-add on a product, as the CPU vector code forms it.
//
// The cos/sin tables [T, D/2] are computed on the device in f64 (angles reach 16K positions times
// theta^0) and rounded once to the dtype, then kept per device, dtype and key: steady-state steps
// build nothing. One thread per (head row, i) pair; each pair is loaded before either output is
// stored, so y may alias x.
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

// Where the head vectors sit: row r = token * heads + h is the D values at
// base + token * token_stride + offset + h * D (a compact tensor: stride H * D, offset 0).
struct HeadRows {
  int64_t token_stride, offset;
};

template <class T>
__global__ void rope_table_kernel(int64_t pos_offset, int64_t seq, int64_t D, double theta, T* cos_table,
                                  T* sin_table) {
  const int64_t half = D / 2;
  for (int64_t e = first_index(); e < seq * half; e += grid_stride()) {
    const int64_t t = e / half, i = e % half;
    const double angle =
        static_cast<double>(pos_offset + t) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    cos_table[e] = static_cast<T>(cos(angle));
    sin_table[e] = static_cast<T>(sin(angle));
  }
}

// x as autograd kept it (K: T, or a bf16 copy under mixed precision: kept_value); y as T, or under the
// same mode in bf16 where only GEMMs read it (Y: store_operand). x16, where not null, receives x's values
// rounded to bf16 at x's own positions (the copy autograd keeps of x).
template <bool kInverse, class T, class K, class Y>
__global__ void rope_kernel(const K* x, HeadRows x_rows, Y* y, HeadRows y_rows, int64_t rows, int64_t seq,
                            int64_t heads, int64_t D, const T* cos_table, const T* sin_table, uint16_t* x16) {
  const int64_t half = D / 2;
  for (int64_t e = first_index(); e < rows * half; e += grid_stride()) {
    const int64_t r = e / half, i = e % half;
    const int64_t token = r / heads, head = r % heads, t = token % seq;
    const K* xa = x + token * x_rows.token_stride + x_rows.offset + head * D;
    Y* ya = y + token * y_rows.token_stride + y_rows.offset + head * D;
    const T a = kept_value<T>(xa, i), b = kept_value<T>(xa, i + half);
    if (x16 != nullptr) {
      uint16_t* copy = x16 + token * x_rows.token_stride + x_rows.offset + head * D;
      copy[i] = f32_to_bf16(static_cast<float>(a));
      copy[i + half] = f32_to_bf16(static_cast<float>(b));
    }
    const T c = cos_table[t * half + i], s = sin_table[t * half + i];
    if constexpr (kInverse) {  // turn by -angle: (a cos + b sin, b cos - a sin)
      store_operand(ya, i, fused_multiply_add(b, s, a * c));
      store_operand(ya, i + half, fused_multiply_add(-a, s, b * c));
    } else {
      store_operand(ya, i, fused_multiply_add(-b, s, a * c));
      store_operand(ya, i + half, fused_multiply_add(a, s, b * c));
    }
  }
}

// The tables of one key on one device, rebuilt only when the key changes. Thread-local, as on the CPU:
// two host threads never share a half-built table.
struct RopeTable {
  int device = -1;
  DType dtype = DType::F32;
  int64_t pos_offset = -1, seq = 0, dim = 0;
  double theta = 0;
  Tensor cos_table, sin_table;
};

const RopeTable& rope_table(Device device, DType dtype, int64_t pos_offset, int64_t seq, int64_t D, double theta) {
  thread_local RopeTable table;
  if (table.device == device.index && table.dtype == dtype && table.pos_offset == pos_offset && table.seq == seq &&
      table.dim == D && table.theta == theta && table.cos_table.defined() && table.cos_table.device() == device)
    return table;
  const int64_t half = D / 2;
  table.cos_table = Tensor::empty({seq, half}, dtype, device);
  table.sin_table = Tensor::empty({seq, half}, dtype, device);
  LT_FLOAT_SWITCH(dtype, T, {
    LT_CUDA_LAUNCH(blocks_for(seq * half), kThreadsPerBlock, rope_table_kernel<T>)(
        pos_offset, seq, D, theta, table.cos_table.data<T>(), table.sin_table.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
  table.device = device.index;
  table.dtype = dtype;
  table.pos_offset = pos_offset;
  table.seq = seq;
  table.dim = D;
  table.theta = theta;
  return table;
}

// RoPE (or its inverse) from the head rows of x (as kept) to those of y (as written), computed in the
// tables' dtype; x16 (or null) as rope_kernel's.
void launch_rope(bool inverse, const Tensor& x, HeadRows x_rows, Tensor& y, HeadRows y_rows, int64_t rows, int64_t seq,
                 int64_t heads, int64_t D, const RopeTable& table, uint16_t* x16 = nullptr) {
  const int64_t n = rows * (D / 2);
  if (n == 0) return;
  LT_FLOAT_SWITCH(table.dtype, T, LT_KEPT_SWITCH(x, T, K, LT_KEPT_SWITCH(y, T, Y, {
                    const K* from = static_cast<const K*>(x.raw_data());
                    Y* to = static_cast<Y*>(y.raw_data());
                    const T* c = table.cos_table.data<T>();
                    const T* s = table.sin_table.data<T>();
                    if (inverse)
                      LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, rope_kernel<true, T, K, Y>)(
                          from, x_rows, to, y_rows, rows, seq, heads, D, c, s, x16);
                    else
                      LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, rope_kernel<false, T, K, Y>)(
                          from, x_rows, to, y_rows, rows, seq, heads, D, c, s, x16);
                  })));
  LT_CUDA_CHECK(cudaGetLastError());
}

// The v block between the projection's rows and compact v: `width` values per token copied from
// column from_start of rows of from_stride to column to_start of rows of to_stride. from as kept, to as
// written (rope_kernel's x and y), and from16 (or null) as x16.
template <class T, class K, class O>
__global__ void copy_block_kernel(const K* from, int64_t from_stride, int64_t from_start, O* to, int64_t to_stride,
                                  int64_t to_start, int64_t tokens, int64_t width, uint16_t* from16) {
  for (int64_t e = first_index(); e < tokens * width; e += grid_stride()) {
    const int64_t token = e / width, j = e % width, at = token * from_stride + from_start + j;
    const T value = kept_value<T>(from, at);
    store_operand(to, token * to_stride + to_start + j, value);
    if (from16 != nullptr) from16[at] = f32_to_bf16(static_cast<float>(value));
  }
}

// In dtype: the copy's element type where from or to is a bf16 copy.
void copy_v_block(DType dtype, const Tensor& from, int64_t from_stride, int64_t from_start, Tensor& to,
                  int64_t to_stride, int64_t to_start, int64_t tokens, int64_t width, uint16_t* from16 = nullptr) {
  const int64_t n = tokens * width;
  if (n == 0) return;
  LT_FLOAT_SWITCH(dtype, T, LT_KEPT_SWITCH(from, T, K, LT_KEPT_SWITCH(to, T, O, {
                    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, copy_block_kernel<T, K, O>)(
                        static_cast<const K*>(from.raw_data()), from_stride, from_start, static_cast<O*>(to.raw_data()),
                        to_stride, to_start, tokens, width, from16);
                  })));
  LT_CUDA_CHECK(cudaGetLastError());
}

// split_qkv_rope_to_cache: one thread per (token, rotated pair of a Q or K head, or V element). The
// angle is the table kernel's expression at the row's own position, so the values are those of
// rope_kernel with a table that starts there.
struct CacheSplit {
  int64_t tokens, T, Hq, Hkv, D, C, capacity;
};
template <class T>
__global__ void split_qkv_rope_to_cache_kernel(const T* qkv, const int64_t* Tk_B, double theta, CacheSplit s, T* q,
                                               T* k_cache, T* v_cache) {
  const int64_t half = s.D / 2, rotated = (s.Hq + s.Hkv) * half, per_token = rotated + s.Hkv * s.D;
  for (int64_t e = first_index(); e < s.tokens * per_token; e += grid_stride()) {
    const int64_t token = e / per_token, j = e % per_token, b = token / s.T;
    const int64_t position = Tk_B[b] + token % s.T;
    const T* from = qkv + token * s.C;
    const int64_t slot = (b * s.capacity + position) * s.Hkv * s.D;
    if (j >= rotated) {
      v_cache[slot + j - rotated] = from[(s.Hq + s.Hkv) * s.D + j - rotated];
      continue;
    }
    const int64_t head = j / half, i = j % half;
    const double angle =
        static_cast<double>(position) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(s.D));
    const T c = static_cast<T>(cos(angle)), sn = static_cast<T>(sin(angle));
    const T a = from[head * s.D + i], bb = from[head * s.D + i + half];
    T* to = head < s.Hq ? q + (token * s.Hq + head) * s.D : k_cache + slot + (head - s.Hq) * s.D;
    to[i] = fused_multiply_add(-bb, sn, a * c);
    to[i + half] = fused_multiply_add(a, sn, bb * c);
  }
}

}  // namespace

void split_qkv_rope_to_cache(const Tensor& qkv, double theta, const std::vector<int64_t>& Tk_B, Tensor& q,
                             Tensor& k_cache, Tensor& v_cache) {
  const CacheSplit s{q.dim(0) * q.dim(1), q.dim(1),        q.dim(2), k_cache.dim(2),
                     q.dim(3),            qkv.dim(2),      k_cache.dim(1)};
  const int64_t n = s.tokens * ((s.Hq + s.Hkv) * (s.D / 2) + s.Hkv * s.D);
  if (n == 0) return;
  const DeviceGuard guard(qkv.device().index);
  // One small host-to-device copy per call (B lengths), as attention_decode's.
  const Tensor lengths_B = Tensor::from_vector<int64_t>({q.dim(0)}, Tk_B).to(qkv.device());
  LT_FLOAT_SWITCH(qkv.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, split_qkv_rope_to_cache_kernel<T>)(
        qkv.data<T>(), lengths_B.data<int64_t>(), theta, s, q.data<T>(), k_cache.data<T>(), v_cache.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void rope(const Tensor& x, double theta, int64_t pos_offset, bool inverse, Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t seq = x.dim(1), heads = x.dim(2), D = x.dim(3);
  const DeviceGuard guard(x.device().index);
  const RopeTable& table = rope_table(x.device(), x.dtype(), pos_offset, seq, D, theta);
  const HeadRows compact{heads * D, 0};
  launch_rope(inverse, x, compact, y, compact, x.numel() / D, seq, heads, D, table);
}

// qkv may be a kept bf16 copy of f32 q, k and v (attention's backward, tensor/cuda/attention.cu): widened
// as it is read.
void split_qkv_rope(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v) {
  split_qkv_rope_keeping(qkv, theta, pos_offset, q, k, v, Tensor());
}

void split_qkv_rope_keeping(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v,
                            const Tensor& qkv_bf16) {
  const int64_t tokens = q.dim(0) * q.dim(1), seq = q.dim(1), Hq = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  const int64_t C = qkv.dim(2);
  if (tokens == 0) return;
  const DeviceGuard guard(qkv.device().index);
  const RopeTable& table = rope_table(qkv.device(), q.dtype(), pos_offset, seq, D, theta);
  uint16_t* qkv16 = qkv_bf16.defined() ? qkv_bf16.bf16_data() : nullptr;
  launch_rope(false, qkv, HeadRows{C, 0}, q, HeadRows{Hq * D, 0}, tokens * Hq, seq, Hq, D, table, qkv16);
  launch_rope(false, qkv, HeadRows{C, Hq * D}, k, HeadRows{Hkv * D, 0}, tokens * Hkv, seq, Hkv, D, table, qkv16);
  copy_v_block(q.dtype(), qkv, C, (Hq + Hkv) * D, v, Hkv * D, 0, tokens, Hkv * D, qkv16);
}

void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, double theta, int64_t pos_offset,
                             Tensor& dqkv) {
  const int64_t tokens = dq.dim(0) * dq.dim(1), seq = dq.dim(1), Hq = dq.dim(2), Hkv = dk.dim(2), D = dq.dim(3);
  const int64_t C = dqkv.dim(2);
  if (tokens == 0) return;
  const DeviceGuard guard(dqkv.device().index);
  // dqkv may be bf16 under mixed precision (qkv_attention_backward): turned back in dq's dtype, then rounded.
  const RopeTable& table = rope_table(dqkv.device(), dq.dtype(), pos_offset, seq, D, theta);
  launch_rope(true, dq, HeadRows{Hq * D, 0}, dqkv, HeadRows{C, 0}, tokens * Hq, seq, Hq, D, table);
  launch_rope(true, dk, HeadRows{Hkv * D, 0}, dqkv, HeadRows{C, Hq * D}, tokens * Hkv, seq, Hkv, D, table);
  copy_v_block(dq.dtype(), dv, Hkv * D, 0, dqkv, C, (Hq + Hkv) * D, tokens, Hkv * D);
}

}  // namespace lt::LT_CUDA_NAMESPACE
