// Small row-wise kernels of the MoE router and combine. They touch N x E or M x C values once, so
// they are memory-bound and written as plain loops the compiler vectorises; rows are independent,
// so splitting them across threads keeps results independent of the thread count.
#include <cmath>

#include "tensor/cpu/kernel_util.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

namespace lt::kernels {
namespace {

int64_t rows_of(const Tensor& t) { return t.dim(-1) ? t.numel() / t.dim(-1) : 0; }

Shape leading_shape(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 1); }

}  // namespace

void normalize_rows(const Tensor& v, Tensor& w, Tensor& sums) {
  check_float(v, "normalize_rows", "v");
  check_like(w, v, "normalize_rows", "w");
  check_like(sums, v, "normalize_rows", "sums");
  check_shape(w, v.shape(), "normalize_rows", "w");
  check_shape(sums, leading_shape(v), "normalize_rows", "sums");
  require_cpu(v, "normalize_rows");
  const int64_t rows = rows_of(v), k = v.dim(-1);
  LT_FLOAT_SWITCH(v.dtype(), T, {
    const T* pv = v.data<T>();
    T* pw = w.data<T>();
    T* ps = sums.data<T>();
    parallel_for(rows, 256, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        T total = 0;
        for (int64_t j = 0; j < k; ++j) total += pv[n * k + j];
        ps[n] = total;
        for (int64_t j = 0; j < k; ++j) pw[n * k + j] = pv[n * k + j] / total;
      }
    });
  });
}

void normalize_rows_backward(const Tensor& w, const Tensor& sums, const Tensor& dw, Tensor& dv) {
  check_float(w, "normalize_rows_backward", "w");
  check_like(dw, w, "normalize_rows_backward", "dw");
  check_like(dv, w, "normalize_rows_backward", "dv");
  check_shape(dw, w.shape(), "normalize_rows_backward", "dw");
  check_shape(dv, w.shape(), "normalize_rows_backward", "dv");
  require_cpu(w, "normalize_rows_backward");
  const int64_t rows = rows_of(w), k = w.dim(-1);
  LT_FLOAT_SWITCH(w.dtype(), T, {
    const T* pw = w.data<T>();
    const T* ps = sums.data<T>();
    const T* pg = dw.data<T>();
    T* pd = dv.data<T>();
    parallel_for(rows, 256, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        T dot = 0;
        for (int64_t j = 0; j < k; ++j) dot += pg[n * k + j] * pw[n * k + j];
        for (int64_t j = 0; j < k; ++j) pd[n * k + j] = (pg[n * k + j] - dot) / ps[n];
      }
    });
  });
}

void row_logsumexp(const Tensor& x, Tensor& lse) {
  check_float(x, "row_logsumexp", "x");
  check_like(lse, x, "row_logsumexp", "lse");
  check_shape(lse, leading_shape(x), "row_logsumexp", "lse");
  require_cpu(x, "row_logsumexp");
  const int64_t rows = rows_of(x), e = x.dim(-1);
  LT_FLOAT_SWITCH(x.dtype(), T, {
    const T* px = x.data<T>();
    T* pl = lse.data<T>();
    parallel_for(rows, 256, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const T* row = px + n * e;
        T max = row[0];
        for (int64_t j = 1; j < e; ++j) max = std::max(max, row[j]);
        T total = 0;
        for (int64_t j = 0; j < e; ++j) total += std::exp(row[j] - max);
        pl[n] = max + std::log(total);
      }
    });
  });
}

void scale_rows(const Tensor& x, const Tensor& w, Tensor& out) {
  check_float(x, "scale_rows", "x");
  check_like(w, x, "scale_rows", "w");
  check_like(out, x, "scale_rows", "out");
  check_shape(w, leading_shape(x), "scale_rows", "w");
  check_shape(out, x.shape(), "scale_rows", "out");
  require_cpu(x, "scale_rows");
  const int64_t rows = rows_of(x), c = x.dim(-1);
  LT_FLOAT_SWITCH(x.dtype(), T, {
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    T* po = out.data<T>();
    parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m)
        for (int64_t j = 0; j < c; ++j) po[m * c + j] = px[m * c + j] * pw[m];
    });
  });
}

void scale_rows_backward(const Tensor& x, const Tensor& w, const Tensor& g, Tensor& dx, Tensor& dw) {
  check_float(x, "scale_rows_backward", "x");
  check_like(g, x, "scale_rows_backward", "g");
  check_shape(g, x.shape(), "scale_rows_backward", "g");
  require_cpu(x, "scale_rows_backward");
  const int64_t rows = rows_of(x), c = x.dim(-1);
  const bool want_dx = dx.defined(), want_dw = dw.defined();
  if (want_dx) check_shape(dx, x.shape(), "scale_rows_backward", "dx");
  if (want_dw) check_shape(dw, leading_shape(x), "scale_rows_backward", "dw");
  LT_FLOAT_SWITCH(x.dtype(), T, {
    const T* px = x.data<T>();
    const T* pw = w.data<T>();
    const T* pg = g.data<T>();
    T* pdx = want_dx ? dx.data<T>() : nullptr;
    T* pdw = want_dw ? dw.data<T>() : nullptr;
    parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        if (pdx)
          for (int64_t j = 0; j < c; ++j) pdx[m * c + j] = pg[m * c + j] * pw[m];
        if (pdw) {
          T dot = 0;
          for (int64_t j = 0; j < c; ++j) dot += pg[m * c + j] * px[m * c + j];
          pdw[m] = dot;
        }
      }
    });
  });
}

}  // namespace lt::kernels
