// The CPU backend: the Highway kernels behind the front doors of tensor/kernels/<family>.cpp.
//
// Each kernel has the contract of its front door (tensor/kernels.def, where its signature is written once
// for the front door and both backends) and checks nothing: the front door has checked dtypes, shapes,
// devices and index ranges. The vector code is compiled for every Highway target and chosen at run time
// (HWY_DYNAMIC_DISPATCH in each tensor/cpu/<family>.cc), so one binary runs the best instruction set of
// the machine it lands on. Below the list, what only the CPU backend has.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace lt::cpu {

using kernels::AdamWRun;
using kernels::AdamWStep;
using kernels::BinaryOp;
using kernels::GroupedProduct;
using kernels::GroupedWeightGrad;
using kernels::MatmulPrecision;

#include "tensor/backend_kernels.inc"

// ---- matrix multiply (gemm.cc) -------------------------------------------------------------------
// BF16Inputs multiplies f32 in bf16 (rounded operands, f32 sums) where bf16_matmul_available(), else as
// f32; f64 is always exact.
// With addend (c's shape), c = (alpha op(a) op(b) + beta c) + addend, the addend joining each element of
// the finished product in the pass that writes it: the bits of the matmul followed by an add.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision, const Tensor& addend = Tensor());
// One 2-D matmul with operands gathered by row: with a_rows (i32), the rows of a that op(a) reads are
// a[a_rows[i]] (op(a)'s rows, or its k's when a is transposed); with b_rows, b [K, N] (not transposed)
// has rows b[b_rows[k]]. An undefined index reads the rows in order. The gather happens in the GEMM's
// packing (or its in-place reads), not as a pass of its own; the results have matmul's bits on the
// gathered operands.
// b_pairs: op(b) packed beforehand by pack_b_pairs (b not gathered), read by a bf16 product in place of
// packing b again; the same bits.
void matmul_gathered(const Tensor& a, const Tensor& a_rows, bool trans_a, const Tensor& b, const Tensor& b_rows,
                     bool trans_b, Tensor& c, double alpha, double beta, MatmulPrecision precision,
                     const Tensor& b_pairs = Tensor());
// op(b) of a BF16Inputs GEMM (b f32 [K, N], or [N, K] when trans_b) packed whole into the bf16 pair panels
// the GEMM reads, for several GEMMs against the same b (an expert's weight against its parts of rows):
// i32 storage valid while the tile unit (tensor/cpu/amx.h) stays; undefined where this CPU has no bf16
// GEMM.
Tensor pack_b_pairs(const Tensor& b, bool trans_b);
// True when this CPU multiplies bf16 natively (AVX512_BF16, tensor/cpu/bf16_dot.h).
bool bf16_matmul_available();
// The constant operands of the calling thread's GEMMs from begin to the matching end (the scope of
// kernels::ReusedMatmulOperands); scopes nest.
struct ReusedOperands;
ReusedOperands* begin_reused_operands(std::vector<Tensor> constants);
void end_reused_operands(ReusedOperands* operands);
// The width in bytes of one row of the GEMM's packed B block (NC x the element size; the block is
// KC x NC) on a core with l2_bytes of L2: the block fits that L2, up to 1024 f32 columns.
int64_t gemm_column_block_bytes(int64_t l2_bytes);

// ---- rotary position embedding (rope.cc) ---------------------------------------------------------
// cos and sin of the angles of positions pos_offset .. pos_offset + seq - 1, [seq, D/2] each in the
// dtype: the calling thread's cached tables, valid until its next call with other arguments.
struct RopeTables {
  const void* cos = nullptr;
  const void* sin = nullptr;
};
RopeTables rope_tables(DType dtype, int64_t pos_offset, int64_t seq, int64_t D, double theta);

// ---- MoE statistics and dispatch (moe_stats.cc) ---------------------------------------------------
// The grouped GEMMs of the front doors' lists, expert by expert, in the given precision.
void grouped_matmuls(const std::vector<GroupedProduct>& products, const Tensor& offsets, MatmulPrecision precision);
void grouped_weight_grads(const std::vector<GroupedWeightGrad>& grads, const Tensor& offsets,
                          MatmulPrecision precision);

}  // namespace lt::cpu
