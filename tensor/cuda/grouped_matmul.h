// The definitions of lt::cuda::grouped_matmul and grouped_weight_grad: one grouped GEMM each
// (cuda::grouped_gemm, a single cuBLAS call) whose problems are the experts with rows, in expert order.
// Included by exactly one file of a program: tensor/cuda/gemm.cu, or tests/cuda/emulated_gpu.cpp where
// that stands in for the backend (after tensor/cuda/emulation.h, which then runs the kernel below).
//
// The problems' sizes come from the host copy of the offsets, since cuBLAS takes them on the host. Their
// addresses are written on the device, by a kernel reading the offsets there: the call needs no copy to
// the device and so no wait. An expert without rows is no problem of the call; its weight gradient,
// when written (beta 0), is zeroed instead.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/grouped_gemm.h"

namespace lt::cuda {
namespace {

// Where expert e's matrix of an operand starts, its segment beginning at row `first`:
// base + e * expert_bytes + first * row_bytes (a stacked weight steps by expert, a segment by row).
struct OperandLayout {
  const char* base;
  int64_t expert_bytes, row_bytes;
};

// pointers [3, E]: the addresses of a, b and c of problem j, the j-th expert with rows, in column j (the
// columns past the last problem unwritten). A thread per expert counts the experts with rows before it:
// E is at most a few hundred.
__global__ void grouped_pointers_kernel(const int64_t* offsets, int64_t E, OperandLayout a, OperandLayout b,
                                        OperandLayout c, int64_t* pointers) {
  for (int64_t e = first_index(); e < E; e += grid_stride()) {
    const int64_t first = offsets[e];
    if (offsets[e + 1] == first) continue;
    int64_t j = 0;
    for (int64_t before = 0; before < e; ++before) j += offsets[before + 1] > offsets[before] ? 1 : 0;
    const OperandLayout layouts[3] = {a, b, c};
    for (int o = 0; o < 3; ++o) {
      const char* address = layouts[o].base + e * layouts[o].expert_bytes + first * layouts[o].row_bytes;
      pointers[o * E + j] = static_cast<int64_t>(reinterpret_cast<intptr_t>(address));
    }
  }
}

// t's matrix of expert e from row `first` on, where t steps `expert_elements` per expert and
// `row_elements` per row.
OperandLayout layout_of(const Tensor& t, int64_t expert_elements, int64_t row_elements) {
  const auto bytes = static_cast<int64_t>(dtype_size(t.dtype()));
  return {static_cast<const char*>(t.raw_data()), expert_elements * bytes, row_elements * bytes};
}

bool aligned16(const OperandLayout& l) {
  return reinterpret_cast<uintptr_t>(l.base) % 16 == 0 && l.expert_bytes % 16 == 0 && l.row_bytes % 16 == 0;
}

// cuBLAS reads whole matrices: the front door gathers an operand by row before it reaches here.
void matmul_in_order(const Tensor& a, const Tensor& a_rows, bool trans_a, const Tensor& b, const Tensor& b_rows,
                     bool trans_b, Tensor& c, double alpha, double beta, MatmulPrecision precision) {
  LT_CHECK(!a_rows.defined() && !b_rows.defined(), "cuda grouped matmul: operands gathered by row reach the device");
  matmul(a, trans_a, b, trans_b, c, alpha, beta, precision);
}

// Mixed precision of f32 operands (MatmulPrecision::BF16Inputs); f64 stays exact.
bool bf16_inputs(const Tensor& a, MatmulPrecision precision) {
  return precision == MatmulPrecision::BF16Inputs && a.dtype() == DType::F32;
}

// An operand as the grouped call multiplies it: under mixed precision rounded to bf16 once for all the
// experts, the same values as rounding each expert's rows.
Tensor grouped_operand(const Tensor& x, bool rounded) {
  if (!rounded) return x;
  Tensor x16 = Tensor::empty(x.shape(), DType::BF16, x.device());
  round_to_bf16(x, x16);
  return x16;
}

// The call over the experts with rows: their addresses from the device's offsets, then one grouped GEMM.
// False, with nothing queued, where it cannot be one call: bf16 operands whose rows are not aligned for
// cuBLAS's tensor-core kernels, or a cuBLAS that refuses them. The caller then goes expert by expert.
bool grouped_over_experts(GroupedGemm& g, const Tensor& offsets, const OperandLayout& a, const OperandLayout& b,
                          const OperandLayout& c, MatmulPrecision precision) {
  g.aligned16 = aligned16(a) && aligned16(b) && aligned16(c);
  if (g.a.dtype() == DType::BF16 && !g.aligned16) return false;
  if (g.m.empty()) return true;
  const int64_t E = offsets.numel() - 1;
  const DeviceGuard guard(offsets.device().index);
  // Sized by the experts, not by those with rows, so that every step asks the allocator for the same
  // sizes (a new size in a later step would go to the driver).
  g.pointers = Tensor::empty({3, E}, DType::I64, offsets.device());
  LT_CUDA_LAUNCH(blocks_for(E), kThreadsPerBlock, grouped_pointers_kernel)(offsets.data<int64_t>(), E, a, b, c,
                                                                          g.pointers.data<int64_t>());
  LT_CUDA_CHECK(cudaGetLastError());
  return grouped_gemm(g, precision);
}

}  // namespace

void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& offsets, const Tensor& host_offsets,
                    Tensor& out, double beta, MatmulPrecision precision) {
  const int64_t* off = host_offsets.data<int64_t>();
  const int64_t E = w.dim(0), K = a.dim(1), N = out.dim(1);
  if (out.numel() == 0) return;
  const bool rounded = bf16_inputs(a, precision);
  // K = 0: no products to sum, each segment is beta times itself, which matmul writes without cuBLAS.
  if (K == 0 || (rounded && !grouped_gemm_takes_bf16()))
    return grouped_matmul_by_segments({a, w, trans_w, out, beta}, off, precision, matmul_in_order);
  GroupedGemm g{grouped_operand(a, rounded), grouped_operand(w, rounded), out, false, trans_w, beta, {}, {}, {},
                Tensor(), false};
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] == off[e]) continue;
    g.m.push_back(off[e + 1] - off[e]);
    g.n.push_back(N);
    g.k.push_back(K);
  }
  if (!grouped_over_experts(g, offsets, layout_of(g.a, 0, K), layout_of(g.b, N * K, 0), layout_of(out, 0, N),
                            precision))
    grouped_matmul_by_segments({a, w, trans_w, out, beta}, off, precision, matmul_in_order);
}

void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& offsets, const Tensor& host_offsets,
                         Tensor& dw, double beta, MatmulPrecision precision) {
  const int64_t* off = host_offsets.data<int64_t>();
  const int64_t E = dw.dim(0), P = dw.dim(1), Q = dw.dim(2);
  if (dw.numel() == 0) return;
  const bool rounded = bf16_inputs(a, precision);
  if (rounded && !grouped_gemm_takes_bf16())
    return grouped_weight_grad_by_segments({a, b, dw, beta}, off, precision, matmul_in_order);
  GroupedGemm g{grouped_operand(a, rounded), grouped_operand(b, rounded), dw, true, false, beta, {}, {}, {},
                Tensor(), false};
  for (int64_t e = 0; e < E; ++e) {
    if (off[e + 1] > off[e]) {
      g.m.push_back(P);
      g.n.push_back(Q);
      g.k.push_back(off[e + 1] - off[e]);
    } else if (beta == 0) {
      dw.narrow(e, 1).zero_();
    }
  }
  if (!grouped_over_experts(g, offsets, layout_of(g.a, 0, P), layout_of(g.b, 0, Q), layout_of(dw, P * Q, 0),
                            precision))
    grouped_weight_grad_by_segments({a, b, dw, beta}, off, precision, matmul_in_order);
}

}  // namespace lt::cuda
