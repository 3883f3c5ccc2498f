// The grouped GEMMs over a dispatch's expert segments as one dense GEMM per expert with rows, shared by
// the backends (tensor/cpu/moe_stats.cc with the CPU GEMM, tensor/cuda/gemm.cu with cuBLAS): each
// expert's rows are contiguous, so its work is as efficient as its segment allows. `offsets` [E + 1]
// is read on the host. `matmul` is the backend's matmul on operands that may be gathered by row:
// matmul(a, a_rows, trans_a, b, b_rows, trans_b, c, alpha, beta, precision), an undefined index reading
// the rows in order (cpu::matmul_gathered's contract).
#pragma once
#include <cstdint>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace lt {

// Rows [first, first + count) of an operand whose rows may be gathered: the matrix's own rows, or the
// whole matrix read through those rows of its index.
struct OperandRows {
  Tensor matrix, rows;
};
inline OperandRows operand_rows(const Tensor& matrix, const Tensor& rows, int64_t first, int64_t count) {
  if (rows.defined()) return {matrix, rows.narrow(first, count)};
  return {matrix.narrow(first, count), Tensor()};
}

// Rows [first, first + rows) of a grouped matmul, all of expert e's segment: out[R] = a[R] w[e]^T (trans_w)
// or a[R] w[e], plus beta out[R].
template <class Matmul>
void grouped_matmul_rows(const kernels::GroupedProduct& p, int64_t e, int64_t first, int64_t rows,
                         kernels::MatmulPrecision precision, Matmul matmul) {
  if (rows == 0) return;
  Tensor out_rows = p.out.narrow(first, rows);
  const OperandRows a = operand_rows(p.a, p.a_rows, first, rows);
  matmul(a.matrix, a.rows, false, p.w.narrow(e, 1).reshape({p.w.dim(1), p.w.dim(2)}), Tensor(), p.trans_w, out_rows,
         1.0, p.beta, precision);
}

// Expert e's weight gradient: dw[e] = a[R_e]^T b[R_e], written (beta 0) or added (beta 1); an expert
// without rows contributes zero.
template <class Matmul>
void grouped_weight_grad_segment(const kernels::GroupedWeightGrad& g, const int64_t* offsets, int64_t e,
                                 kernels::MatmulPrecision precision, Matmul matmul) {
  const int64_t rows = offsets[e + 1] - offsets[e];
  Tensor dw_e = g.dw.narrow(e, 1).reshape({g.dw.dim(1), g.dw.dim(2)});
  if (rows > 0) {
    const OperandRows a = operand_rows(g.a, g.a_rows, offsets[e], rows);
    const OperandRows b = operand_rows(g.b, g.b_rows, offsets[e], rows);
    matmul(a.matrix, a.rows, true, b.matrix, b.rows, false, dw_e, 1.0, g.beta, precision);
  } else if (g.beta == 0) {
    dw_e.zero_();
  }
}

// Every expert in turn.
template <class Matmul>
void grouped_matmul_by_segments(const kernels::GroupedProduct& p, const int64_t* offsets,
                                kernels::MatmulPrecision precision, Matmul matmul) {
  for (int64_t e = 0; e < p.w.dim(0); ++e)
    grouped_matmul_rows(p, e, offsets[e], offsets[e + 1] - offsets[e], precision, matmul);
}

template <class Matmul>
void grouped_weight_grad_by_segments(const kernels::GroupedWeightGrad& g, const int64_t* offsets,
                                     kernels::MatmulPrecision precision, Matmul matmul) {
  for (int64_t e = 0; e < g.dw.dim(0); ++e) grouped_weight_grad_segment(g, offsets, e, precision, matmul);
}

}  // namespace lt
