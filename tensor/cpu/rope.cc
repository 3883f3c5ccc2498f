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
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/rope.cc"
#include <algorithm>
#include <cmath>
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernel_util.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Rotates every row of x [rows, D] into y; row r is at sequence index (r / heads) % seq, whose cos and
// sin are row t of the tables cos_table, sin_table [seq, D/2].
template <bool kInverse, class T>
void RopeRowsT(const T* x, T* y, int64_t rows, int64_t seq, int64_t heads, int64_t D, const T* cos_table,
               const T* sin_table) {
  const int64_t half = D / 2;
  parallel_for(rows, std::max<int64_t>(1, 8192 / D), [&](int64_t begin, int64_t end) {
    const hn::ScalableTag<T> d;
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t r = begin; r < end; ++r) {
      const int64_t t = (r / heads) % seq;
      const T* cos_t = cos_table + t * half;
      const T* sin_t = sin_table + t * half;
      const T* xa = x + r * D;
      const T* xb = xa + half;
      T* ya = y + r * D;
      T* yb = ya + half;
      int64_t i = 0;
      for (; i + lanes <= half; i += lanes) {
        const auto a = hn::LoadU(d, xa + i), b = hn::LoadU(d, xb + i);
        const auto c = hn::LoadU(d, cos_t + i), s = hn::LoadU(d, sin_t + i);
        if constexpr (kInverse) {  // turn by -angle: (a cos + b sin, b cos - a sin)
          hn::StoreU(hn::MulAdd(b, s, hn::Mul(a, c)), d, ya + i);
          hn::StoreU(hn::NegMulAdd(a, s, hn::Mul(b, c)), d, yb + i);
        } else {
          hn::StoreU(hn::NegMulAdd(b, s, hn::Mul(a, c)), d, ya + i);
          hn::StoreU(hn::MulAdd(a, s, hn::Mul(b, c)), d, yb + i);
        }
      }
      for (; i < half; ++i) {
        const T a = xa[i], b = xb[i], c = cos_t[i], s = kInverse ? -sin_t[i] : sin_t[i];
        ya[i] = a * c - b * s;
        yb[i] = b * c + a * s;
      }
    }
  });
}

void RopeKernel(DType dtype, bool inverse, const void* x, void* y, int64_t rows, int64_t seq, int64_t heads,
                int64_t D, const void* cos_table, const void* sin_table) {
  LT_FLOAT_SWITCH(dtype, T, {
    const T* tx = static_cast<const T*>(x);
    T* ty = static_cast<T*>(y);
    const T* tc = static_cast<const T*>(cos_table);
    const T* ts = static_cast<const T*>(sin_table);
    if (inverse) RopeRowsT<true>(tx, ty, rows, seq, heads, D, tc, ts);
    else RopeRowsT<false>(tx, ty, rows, seq, heads, D, tc, ts);
  });
}

}  // namespace lt::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::kernels {
HWY_EXPORT(RopeKernel);

namespace {

// cos and sin of the angles of positions [pos_offset, pos_offset + seq), [seq, D/2], in the dtype T.
template <class T>
struct RopeTable {
  int64_t pos_offset = -1, seq = 0, dim = 0;  // what the tables hold; pos_offset -1: nothing yet
  double theta = 0;
  std::vector<double> inv_freq;  // [D/2]
  std::vector<T> cos_table, sin_table;
};

// The calling thread's table for this range, rebuilt only when the key changes. Thread-local, so two
// threads calling rope at once never share a half-built table.
template <class T>
const RopeTable<T>& rope_table(int64_t pos_offset, int64_t seq, int64_t D, double theta) {
  thread_local RopeTable<T> table;
  if (table.pos_offset == pos_offset && table.seq == seq && table.dim == D && table.theta == theta) return table;
  const int64_t half = D / 2;
  table.inv_freq.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    table.inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  table.cos_table.resize(static_cast<size_t>(seq * half));
  table.sin_table.resize(static_cast<size_t>(seq * half));
  // Plain pointers for the workers: inside their chunks the name `table` would mean their own copy.
  const double* inv_freq = table.inv_freq.data();
  T* cos_table = table.cos_table.data();
  T* sin_table = table.sin_table.data();
  parallel_for(seq, std::max<int64_t>(1, 1024 / half), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const double position = static_cast<double>(pos_offset + t);
      for (int64_t i = 0; i < half; ++i) {
        const double angle = position * inv_freq[i];
        cos_table[t * half + i] = static_cast<T>(std::cos(angle));
        sin_table[t * half + i] = static_cast<T>(std::sin(angle));
      }
    }
  });
  table.pos_offset = pos_offset;
  table.seq = seq;
  table.dim = D;
  table.theta = theta;
  return table;
}

}  // namespace

void rope(const Tensor& x, double theta, int64_t pos_offset, bool inverse, Tensor& y) {
  check_float(x, "rope", "x");
  check_like(y, x, "rope", "y");
  LT_CHECK(x.ndim() == 4, "rope: x must be [B, T, H, D], got ", x.str());
  check_shape(y, x.shape(), "rope", "y");
  LT_CHECK(x.dim(3) % 2 == 0, "rope: head dim D must be even, got ", x.str());
  LT_CHECK(theta > 0, "rope: theta must be positive, got ", theta);
  LT_CHECK(pos_offset >= 0, "rope: pos_offset must be >= 0, got ", pos_offset);
  require_cpu(x, "rope");
  if (x.numel() == 0) return;
  const int64_t seq = x.dim(1), heads = x.dim(2), D = x.dim(3);
  LT_FLOAT_SWITCH(x.dtype(), T, {
    const RopeTable<T>& table = rope_table<T>(pos_offset, seq, D, theta);
    HWY_DYNAMIC_DISPATCH(RopeKernel)(x.dtype(), inverse, x.raw_data(), y.raw_data(), x.numel() / D, seq, heads, D,
                                     table.cos_table.data(), table.sin_table.data());
  });
}

}  // namespace lt::kernels
#endif  // HWY_ONCE
