// The grouped GEMMs over a dispatch's expert segments as one dense GEMM per expert with rows, shared by
// the backends (tensor/cpu/moe_stats.cc with the CPU GEMM, tensor/cuda/gemm.cu with cuBLAS): each
// expert's rows are contiguous, so its work is as efficient as its segment allows. `offsets` [E + 1]
// is read on the host.
#pragma once
#include <cstdint>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace lt {

// Rows [first, first + rows) of a grouped matmul, all of expert e's segment: out[R] = a[R] w[e]^T (trans_w)
// or a[R] w[e], plus beta out[R], with `matmul` the backend's matmul (kernels::matmul's arguments, then
// the precision).
template <class Matmul>
void grouped_matmul_rows(const Tensor& a, const Tensor& w, bool trans_w, int64_t e, int64_t first, int64_t rows,
                         Tensor& out, double beta, kernels::MatmulPrecision precision, Matmul matmul) {
  if (rows == 0) return;
  Tensor out_rows = out.narrow(first, rows);
  matmul(a.narrow(first, rows), false, w.narrow(e, 1).reshape({w.dim(1), w.dim(2)}), trans_w, out_rows, 1.0, beta,
         precision);
}

// Expert e's part of a grouped matmul: its whole segment R_e.
template <class Matmul>
void grouped_matmul_segment(const Tensor& a, const Tensor& w, bool trans_w, const int64_t* offsets, int64_t e,
                            Tensor& out, double beta, kernels::MatmulPrecision precision, Matmul matmul) {
  grouped_matmul_rows(a, w, trans_w, e, offsets[e], offsets[e + 1] - offsets[e], out, beta, precision, matmul);
}

// Expert e's weight gradient: dw[e] = a[R_e]^T b[R_e], written (beta 0) or added (beta 1); an expert
// without rows contributes zero.
template <class Matmul>
void grouped_weight_grad_segment(const Tensor& a, const Tensor& b, const int64_t* offsets, int64_t e, Tensor& dw,
                                 double beta, kernels::MatmulPrecision precision, Matmul matmul) {
  const int64_t rows = offsets[e + 1] - offsets[e];
  Tensor dw_e = dw.narrow(e, 1).reshape({dw.dim(1), dw.dim(2)});
  if (rows > 0) {
    matmul(a.narrow(offsets[e], rows), true, b.narrow(offsets[e], rows), false, dw_e, 1.0, beta, precision);
  } else if (beta == 0) {
    dw_e.zero_();
  }
}

// Every expert in turn.
template <class Matmul>
void grouped_matmul_by_segments(const Tensor& a, const Tensor& w, bool trans_w, const int64_t* offsets, Tensor& out,
                                double beta, kernels::MatmulPrecision precision, Matmul matmul) {
  for (int64_t e = 0; e < w.dim(0); ++e)
    grouped_matmul_segment(a, w, trans_w, offsets, e, out, beta, precision, matmul);
}

template <class Matmul>
void grouped_weight_grad_by_segments(const Tensor& a, const Tensor& b, const int64_t* offsets, Tensor& dw,
                                     double beta, kernels::MatmulPrecision precision, Matmul matmul) {
  for (int64_t e = 0; e < dw.dim(0); ++e) grouped_weight_grad_segment(a, b, offsets, e, dw, beta, precision, matmul);
}

}  // namespace lt
