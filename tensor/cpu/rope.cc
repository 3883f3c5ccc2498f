// Rotary position embedding, rotate-half (NeoX) convention, and its inverse (the backward).
//
// A head vector x of even length D is split into halves a = x[:D/2] and b = x[D/2:]; element i of each
// half turns by the angle (pos_offset + t) * theta^(-2i/D):
//   y[i] = a[i] cos - b[i] sin,   y[i + D/2] = b[i] cos + a[i] sin.
// A rotation's transpose is its inverse, so the backward is the same kernel turning by -angle.
//
// Numerics: the angles and their cos/sin are computed in double (positions reach 16K and theta 600000,
// where a float angle keeps only a few correct digits of its fractional turn) and rounded once to the
// tensor's dtype. Memory: the tables are cached per (position range, D, theta) in buffers that only
// grow, so steady-state steps (the same T every step, q and k alike) compute and allocate nothing.
// In place: y may alias x; each pair (a[i], b[i]) is loaded before either of its elements is stored.
//
// The same kernel reads or writes head vectors inside a fused QKV projection's rows, so attention's
// split of the projection and RoPE on q and k are one pass each way, with no column copies in between.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/rope.cc"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/rope-inl.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

#ifndef LINGTRAIN_ROPE_HEAD_ROWS  // once, outside the per-target namespaces: the dispatched signature uses it
#define LINGTRAIN_ROPE_HEAD_ROWS
namespace lt::cpu {
// Where the head vectors sit: row r = token * heads + h is the D values at
// base + token * token_stride + offset + h * D. A compact [B, T, H, D] tensor has token_stride H * D and
// offset 0; a block of columns of a fused projection has the projection's width and the block's start.
struct HeadRows {
  int64_t token_stride, offset;
};
}  // namespace lt::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {

// Rotates every head vector of x into y; row r is at sequence index (r / heads) % seq, whose cos and
// sin are row t of the tables cos_table, sin_table [seq, D/2].
template <bool kInverse, class T>
void RopeRowsT(const T* x, HeadRows x_rows, T* y, HeadRows y_rows, int64_t rows, int64_t seq, int64_t heads,
               int64_t D, const T* cos_table, const T* sin_table) {
  const int64_t half = D / 2;
  parallel_for(rows, std::max<int64_t>(1, 8192 / D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t token = r / heads, head = r % heads, t = token % seq;
      const T* x_row = x + token * x_rows.token_stride + x_rows.offset + head * D;
      T* y_row = y + token * y_rows.token_stride + y_rows.offset + head * D;
      RotateHalf<kInverse>(x_row, y_row, cos_table + t * half, sin_table + t * half, half);
    }
  });
}

void RopeKernel(DType dtype, bool inverse, const void* x, HeadRows x_rows, void* y, HeadRows y_rows, int64_t rows,
                int64_t seq, int64_t heads, int64_t D, const void* cos_table, const void* sin_table) {
  LT_FLOAT_SWITCH(dtype, T, {
    const T* tx = static_cast<const T*>(x);
    T* ty = static_cast<T*>(y);
    const T* tc = static_cast<const T*>(cos_table);
    const T* ts = static_cast<const T*>(sin_table);
    if (inverse) RopeRowsT<true>(tx, x_rows, ty, y_rows, rows, seq, heads, D, tc, ts);
    else RopeRowsT<false>(tx, x_rows, ty, y_rows, rows, seq, heads, D, tc, ts);
  });
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(RopeKernel);

namespace {

// cos and sin of the angles of positions [0, positions), [positions, D/2], in the dtype T.
template <class T>
struct RopeTable {
  int64_t positions = 0, dim = 0;
  double theta = 0;
  std::vector<double> inv_freq;  // [D/2]
  std::vector<T> cos_table, sin_table;
};

// The calling thread's table, holding at least positions [0, end): grown when a later position is asked
// for (decoding rows one position at a time, each at its own), made anew when D or theta changes. Every
// entry is a function of its position alone, so a range reads the same values whatever was asked before.
// Thread-local, so two threads calling rope at once never share a half-built table.
template <class T>
const RopeTable<T>& rope_table(int64_t end, int64_t D, double theta) {
  thread_local RopeTable<T> table;
  if (table.dim != D || table.theta != theta) {
    table.positions = 0;
    table.dim = D;
    table.theta = theta;
    table.inv_freq.resize(static_cast<size_t>(D / 2));
    for (int64_t i = 0; i < D / 2; ++i)
      table.inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  }
  if (end <= table.positions) return table;
  const int64_t half = D / 2, first = table.positions;
  // At least double the positions: a decode that asks for one more position each step grows it rarely.
  const int64_t grown = std::max(end, 2 * first);
  table.cos_table.resize(static_cast<size_t>(grown * half));
  table.sin_table.resize(static_cast<size_t>(grown * half));
  // Plain pointers for the workers: inside their chunks the name `table` would mean their own copy.
  const double* inv_freq = table.inv_freq.data();
  T* cos_table = table.cos_table.data();
  T* sin_table = table.sin_table.data();
  parallel_for(grown - first, std::max<int64_t>(1, 1024 / half), [&](int64_t begin, int64_t stop) {
    for (int64_t t = first + begin; t < first + stop; ++t) {
      const double position = static_cast<double>(t);
      for (int64_t i = 0; i < half; ++i) {
        const double angle = position * inv_freq[i];
        cos_table[t * half + i] = static_cast<T>(std::cos(angle));
        sin_table[t * half + i] = static_cast<T>(std::sin(angle));
      }
    }
  });
  table.positions = grown;
  return table;
}

// Copies the v block between the projection's rows (width C, v at column start) and compact v.
void copy_v_block(const Tensor& from, int64_t from_stride, int64_t from_start, Tensor& to, int64_t to_stride,
                  int64_t to_start, int64_t tokens, int64_t width) {
  const size_t bytes = static_cast<size_t>(width) * dtype_size(from.dtype());
  const char* src = static_cast<const char*>(from.raw_data());
  char* dst = static_cast<char*>(to.raw_data());
  const int64_t elem = static_cast<int64_t>(dtype_size(from.dtype()));
  parallel_for(tokens, std::max<int64_t>(1, 16384 / std::max<int64_t>(width, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      std::memcpy(dst + (t * to_stride + to_start) * elem, src + (t * from_stride + from_start) * elem, bytes);
  });
}

}  // namespace

RopeTables rope_tables(DType dtype, int64_t pos_offset, int64_t seq, int64_t D, double theta) {
  RopeTables tables;
  LT_FLOAT_SWITCH(dtype, T, {
    const RopeTable<T>& table = rope_table<T>(pos_offset + seq, D, theta);
    const size_t first = static_cast<size_t>(pos_offset * (D / 2));
    tables = {table.cos_table.data() + first, table.sin_table.data() + first};
  });
  return tables;
}

void rope(const Tensor& x, double theta, int64_t pos_offset, bool inverse, Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t seq = x.dim(1), heads = x.dim(2), D = x.dim(3);
  const HeadRows compact{heads * D, 0};
  const RopeTables tables = rope_tables(x.dtype(), pos_offset, seq, D, theta);
  HWY_DYNAMIC_DISPATCH(RopeKernel)
  (x.dtype(), inverse, x.raw_data(), compact, y.raw_data(), compact, x.numel() / D, seq, heads, D, tables.cos,
   tables.sin);
}

void split_qkv_rope(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v) {
  const int64_t tokens = q.dim(0) * q.dim(1), seq = q.dim(1), Hq = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  const int64_t C = qkv.dim(2);
  if (tokens == 0) return;
  const RopeTables tables = rope_tables(qkv.dtype(), pos_offset, seq, D, theta);
  HWY_DYNAMIC_DISPATCH(RopeKernel)
  (qkv.dtype(), false, qkv.raw_data(), HeadRows{C, 0}, q.raw_data(), HeadRows{Hq * D, 0}, tokens * Hq, seq, Hq, D,
   tables.cos, tables.sin);
  HWY_DYNAMIC_DISPATCH(RopeKernel)
  (qkv.dtype(), false, qkv.raw_data(), HeadRows{C, Hq * D}, k.raw_data(), HeadRows{Hkv * D, 0}, tokens * Hkv, seq, Hkv,
   D, tables.cos, tables.sin);
  copy_v_block(qkv, C, (Hq + Hkv) * D, v, Hkv * D, 0, tokens, Hkv * D);
}

void split_qkv_rope_to_cache(const Tensor& qkv, double theta, const std::vector<int64_t>& Tk_B, Tensor& q,
                             Tensor& k_cache, Tensor& v_cache) {
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), D = q.dim(3);
  const int64_t capacity = k_cache.dim(1), Hkv = k_cache.dim(2), C = qkv.dim(2);
  if (B * T == 0) return;
  const auto kernel = HWY_DYNAMIC_DISPATCH(RopeKernel);
  const int64_t elem = static_cast<int64_t>(dtype_size(qkv.dtype()));
  const char* from = static_cast<const char*>(qkv.raw_data());
  char* to_q = static_cast<char*>(q.raw_data());
  char* to_k = static_cast<char*>(k_cache.raw_data());
  char* to_v = static_cast<char*>(v_cache.raw_data());
  // Row by row, each at its own positions; a row's T tokens are contiguous in qkv and q, and so are its
  // new positions in the caches.
  for (int64_t b = 0; b < B; ++b) {
    const RopeTables tables = rope_tables(qkv.dtype(), Tk_B[b], T, D, theta);
    const char* row = from + b * T * C * elem;
    const int64_t cached = (b * capacity + Tk_B[b]) * Hkv * D * elem;
    kernel(qkv.dtype(), false, row, HeadRows{C, 0}, to_q + b * T * Hq * D * elem, HeadRows{Hq * D, 0}, T * Hq, T, Hq, D,
           tables.cos, tables.sin);
    kernel(qkv.dtype(), false, row, HeadRows{C, Hq * D}, to_k + cached, HeadRows{Hkv * D, 0}, T * Hkv, T, Hkv, D,
           tables.cos, tables.sin);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(to_v + cached + t * Hkv * D * elem, row + (t * C + (Hq + Hkv) * D) * elem,
                  static_cast<size_t>(Hkv * D * elem));
  }
}

void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, double theta, int64_t pos_offset,
                             Tensor& dqkv) {
  const int64_t tokens = dq.dim(0) * dq.dim(1), seq = dq.dim(1), Hq = dq.dim(2), Hkv = dk.dim(2), D = dq.dim(3);
  const int64_t C = dqkv.dim(2);
  if (tokens == 0) return;
  const RopeTables tables = rope_tables(dqkv.dtype(), pos_offset, seq, D, theta);
  HWY_DYNAMIC_DISPATCH(RopeKernel)
  (dqkv.dtype(), true, dq.raw_data(), HeadRows{Hq * D, 0}, dqkv.raw_data(), HeadRows{C, 0}, tokens * Hq, seq, Hq, D,
   tables.cos, tables.sin);
  HWY_DYNAMIC_DISPATCH(RopeKernel)
  (dqkv.dtype(), true, dk.raw_data(), HeadRows{Hkv * D, 0}, dqkv.raw_data(), HeadRows{C, Hq * D}, tokens * Hkv, seq,
   Hkv, D, tables.cos, tables.sin);
  copy_v_block(dv, Hkv * D, 0, dqkv, C, (Hq + Hkv) * D, tokens, Hkv * D);
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
