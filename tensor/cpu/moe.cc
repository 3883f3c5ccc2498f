// Row-wise kernels of the MoE router and combine. They touch N x E or N x k x C values once, so they
// are memory-bound and written as plain loops the compiler vectorises; rows (tokens) are independent,
// so splitting them across threads keeps results independent of the thread count.
#include <algorithm>
#include <cmath>

#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/moe_rows.h"
#include "tensor/threadpool.h"

namespace lt::cpu {
namespace {

// Rows per chunk so that each chunk touches at least ~4K values.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(cols, 1)); }

}  // namespace

// The rows' arithmetic is shared with the CUDA kernels (tensor/moe_rows.h).
void router_topk(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& ids) {
  const int64_t N = logits.dim(0), E = logits.dim(1);
  LT_FLOAT_SWITCH(logits.dtype(), T, {
    const T* s = logits.data<T>();
    T* p = probs.data<T>();
    T* l = lse.data<T>();
    T* w = weights.data<T>();
    int32_t* id = ids.data<int32_t>();
    parallel_for(N, row_grain(E), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) RouterTopKRow(s + n * E, E, k, renormalize, p + n * E, l + n, w + n * k, id + n * k);
    });
  });
}

void router_topk_backward(const Tensor& probs, const Tensor& ids, bool renormalize, const Tensor& dweights,
                          double scale, Tensor& dlogits) {
  const int64_t N = probs.dim(0), E = probs.dim(1), k = ids.dim(1);
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    const T* p = probs.data<T>();
    const int32_t* id = ids.data<int32_t>();
    const T* dw = dweights.data<T>();
    T* ds = dlogits.data<T>();
    const T s = static_cast<T>(scale);
    parallel_for(N, row_grain(E), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n)
        RouterTopKBackwardRow(p + n * E, id + n * k, E, k, renormalize, dw + n * k, s, ds + n * E);
    });
  });
}

void router_aux_backward(const Tensor& probs, const Tensor& lse, const Tensor& counts, const Tensor& upstream,
                         double balance_scale, double z_scale, Tensor& dlogits) {
  const int64_t N = probs.dim(0), E = probs.dim(1);
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    // The upstream factor joins the scales in f64, as a host-side product of the two would.
    const double g = static_cast<double>(upstream.data<T>()[0]);
    const T a = static_cast<T>(balance_scale * g), b = static_cast<T>(z_scale * g);
    const T* p = probs.data<T>();
    const T* l = lse.data<T>();
    const T* c = counts.data<T>();
    T* ds = dlogits.data<T>();
    parallel_for(N, row_grain(E), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) RouterAuxBackwardRow(p + n * E, l[n], c, E, a, b, ds + n * E);
    });
  });
}

void combine_rows(const Tensor& y, const Tensor& w, const Tensor& pos, Tensor& out, bool add_to_out) {
  // Adding to out, each piece of a row's sum is formed apart first, so that out's value joins it last;
  // pieces of kColumns keep that scratch on the stack.
  constexpr int64_t kColumns = 256;
  const int64_t N = w.dim(0), k = w.dim(1), C = y.dim(1);
  LT_FLOAT_SWITCH(y.dtype(), T, {
    const T* py = y.data<T>();
    const T* pw = w.data<T>();
    const int32_t* ppos = pos.data<int32_t>();
    T* po = out.data<T>();
    parallel_for(N, row_grain(k * C), [&](int64_t begin, int64_t end) {
      T sum[kColumns];
      for (int64_t n = begin; n < end; ++n)
        for (int64_t c0 = 0; c0 < C; c0 += kColumns) {
          const int64_t width = std::min(kColumns, C - c0);
          T* o = add_to_out ? sum : po + n * C + c0;
          const T* y0 = py + static_cast<int64_t>(ppos[n * k]) * C + c0;
          for (int64_t c = 0; c < width; ++c) o[c] = pw[n * k] * y0[c];
          for (int64_t j = 1; j < k; ++j) {
            const T* yj = py + static_cast<int64_t>(ppos[n * k + j]) * C + c0;
            const T wj = pw[n * k + j];
            for (int64_t c = 0; c < width; ++c) o[c] += wj * yj[c];
          }
          if (add_to_out)
            for (int64_t c = 0; c < width; ++c) po[n * C + c0 + c] = sum[c] + po[n * C + c0 + c];
        }
    });
  });
}

}  // namespace lt::cpu
