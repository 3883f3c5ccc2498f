// The AVX512_BF16 instructions the CPU's mixed-precision GEMM is built on (the dot product VDPBF16PS and
// the conversion VCVTNE2PS2BF16), outside Highway: the Highway in use has no target for them, so their
// code is compiled with a function target attribute and runs only after a run-time check of the CPU.
//
// VDPBF16PS multiplies 32 pairs of bf16 values into 16 f32 lanes: lane i += a[2i] b[2i] + a[2i+1]
// b[2i+1], the products exact and the sums in f32 (round to nearest even, subnormals flushed to zero).
// One instruction is two FMAs per lane, so on Zen 4 and Sapphire Rapids it doubles the f32 FMA peak.
// Its operands are "pairs": 32-bit units holding the bf16 of an even k in the low half and of the next
// k in the high half, which is what the bf16 packing of tensor/cpu/gemm.cc produces.
#pragma once
#include <cstdint>

namespace lt::cpu {

// The register tile of the bf16 micro-kernel, that of the f32 AVX-512 one (tensor/cpu/gemm.cc): 6 rows
// of C by 4 vectors of 16 f32 lanes, 24 accumulators.
constexpr int kBf16TileRows = 6;
constexpr int kBf16TileColumns = 64;

// True when this CPU executes AVX512_BF16 with its 512-bit registers enabled by the OS.
bool has_bf16_dot();

// The conversions of the bf16 packing, with AVX512_BF16's own f32 -> bf16 instruction (VCVTNE2PS2BF16:
// nearest even, like Tensor::to; it flushes subnormal inputs to zero, which changes no product, since
// VDPBF16PS reads subnormal bf16 as zero anyway). Call only where has_bf16_dot().
// dst[j] = the pair (src[2j], src[2j + 1]) for j < ceil(n / 2), the last one padded with zero: a row
// contiguous in k converted to bf16 is already a row of pairs.
void row_to_pairs(const float* src, int64_t n, uint32_t* dst);
// dst[j] = the pair (even[j], odd[j]) for j < n: two consecutive k-rows interleaved; odd == nullptr
// stands for a row of zeros (past the end of a block of odd depth).
void interleave_to_pairs(const float* even, const float* odd, int64_t n, uint32_t* dst);
// The same from bf16 values already rounded (a weight's bf16 copy, tensor/bf16_shadow.h): moves only, no
// conversion, half the bytes read.
void row_to_pairs(const uint16_t* src, int64_t n, uint32_t* dst);
void interleave_to_pairs(const uint16_t* even, const uint16_t* odd, int64_t n, uint32_t* dst);

// tile[6][64] (row-major, 64-byte aligned) = the sum over `pairs` k-pairs of a_panel[kp][6] (one pair
// per row of C, broadcast) times b_panel[kp][64] (one pair per column of C), b_panel's rows b_stride
// units apart, in k order. Call only where has_bf16_dot().
void accumulate_tile_bf16(int64_t pairs, const uint32_t* a_panel, const uint32_t* b_panel, int64_t b_stride,
                          float* tile);

// The same product for operands that are not packed panels (attention's blocks, tensor/cpu/attention.cc):
// tile[r][c] (row-major [6][64], 64-byte aligned) = the sum over `pairs` k-pairs of a[r * a_row + kp *
// a_pair] times b[kp * b_stride + c], in k order, for r < rows (at most 6) and c < 16 * vectors (at most 4
// vectors); the rest of the tile is not written, and b is read up to 16 * vectors units of each row. A
// transposed left operand is the same matrix with its strides swapped. Call only where has_bf16_dot().
void accumulate_rows_bf16(int64_t pairs, int rows, int vectors, const uint32_t* a, int64_t a_row, int64_t a_pair,
                          const uint32_t* b, int64_t b_stride, float* tile);

// x[i] = bf16(x[i]) widened back, for i < n: the values a bf16 operand made of x holds (nearest even, like
// row_to_pairs). Call only where has_bf16_dot().
void round_to_bf16(float* x, int64_t n);

}  // namespace lt::cpu
