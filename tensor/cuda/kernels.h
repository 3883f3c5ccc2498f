// The CUDA backend: the kernels behind the front doors of tensor/kernels/<family>.cpp, a peer of the
// CPU backend (tensor/cpu/kernels.h). Each kernel has the contract of its front door (tensor/kernels.def,
// where its signature is written once for the front door and both backends) and checks nothing: the
// front door has checked shapes, dtypes and that every operand is on one device. They run on that
// device's default stream and return without waiting for the GPU (copies to the host wait).
//
// Declared whether or not the backend is compiled: the front doors call these only inside
// `if constexpr (kCudaBackend)` (tensor/device_runtime.h), so a build without nvcc needs no definition.
//
// Adding a CUDA kernel: one .cu file (its device code and the Tensor-level function that launches it),
// its line in tensor/kernels.def (or its declaration here, for one that only this backend has), the CUDA
// branch in its front door, and one entry in cuda_cases() of tests/cuda/test_cuda.cpp, which compares it
// with the CPU kernel on a GPU. Launched through LT_CUDA_LAUNCH and without cuBLAS, the kernel also runs
// on the CPU through tensor/cuda/emulation.h: its .cu file goes into tests/cuda/test_cuda_emulation.cpp,
// which compares it with the CPU kernel here.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

// lt::cuda, or lt::cuda_emulated when a test compiles a .cu file as plain C++ (tensor/cuda/emulation.h).
#ifndef LT_CUDA_NAMESPACE
#define LT_CUDA_NAMESPACE cuda
#endif

namespace lt::LT_CUDA_NAMESPACE {

using kernels::AdamWRun;
using kernels::AdamWStep;
using kernels::BinaryOp;
using kernels::GroupedProduct;
using kernels::GroupedWeightGrad;
using kernels::IndexRange;
using kernels::MatmulPrecision;
using kernels::OutOfRange;

#include "tensor/backend_kernels.inc"

// What only the CUDA backend has. fill, which Tensor::fill_ calls, is declared below the backends, in
// tensor/device_runtime.h.

// The head dims the attention kernels take, up to this (the front door checks; attention.cu).
inline constexpr int64_t kMaxAttentionHeadDim = 128;

// The first id of `ids` (i32 or i64) that `range` does not allow, found on the device and read back:
// the one call here that waits for the GPU, which a front door makes before it lets ids address memory
// (index.cu).
OutOfRange first_out_of_range(const Tensor& ids, const IndexRange& range);

// packed (a device tensor of at least packed_bytes(sources) bytes) = the bytes of every source, each at
// the next multiple of 8 bytes (slice.cu): one launch per kPackSources sources.
void pack_bytes(const std::vector<Tensor>& sources, Tensor& packed);
inline constexpr int kPackSources = 32;

// The grouped GEMMs over a dispatch's segments (grouped_matmul.h), the operands already gathered (no
// a_rows or b_rows): one grouped_gemm over the experts with rows per product, or per pair of products
// independent of each other. offsets are on the device, host_offsets is their host copy (the front
// door's, or a DispatchPlan's), from which the problems' sizes come.
void grouped_matmuls(const std::vector<GroupedProduct>& products, const Tensor& offsets, const Tensor& host_offsets,
                     MatmulPrecision precision);
void grouped_weight_grads(const std::vector<GroupedWeightGrad>& grads, const Tensor& offsets,
                          const Tensor& host_offsets, MatmulPrecision precision);

// One grouped GEMM of one or more parts: problem j of part p is the row-major c_j [m_j, n_j] = op(a_j)
// op(b_j) + beta c_j, where a_j, b_j and c_j are whole rows of the part's (row-major, contiguous)
// operands a, b and c, start at the addresses in pointers (i64 [6, stride >= problems] on the device:
// a_j's, b_j's, c_j's addresses and m_j, n_j, k_j in column j) and keep the operands' row lengths.
// Part p's problems are [p P, (p + 1) P), P = problems_per_part(). a and b are f32, f64, or bf16
// (rounded copies: products summed in f32) with c f32; every part has the same dtypes.
struct GroupedGemm {
  struct Part {
    Tensor a, b, c;
    bool trans_a, trans_b;
    double beta;
  };
  std::vector<Part> parts;
  std::vector<int64_t> m, n, k;  // per problem
  Tensor pointers;
  // Every address is 16-byte aligned, as cuBLAS's tensor-core kernels for arrays of pointers need.
  bool aligned16;

  int64_t problems_per_part() const { return static_cast<int64_t>(m.size() / parts.size()); }
  const Part& part_of(int64_t j) const { return parts[static_cast<size_t>(j / problems_per_part())]; }
  // 2 m n k summed over part p's problems (over every part's: flops()), as the device counters count a
  // GEMM call's work.
  uint64_t part_flops(size_t p) const {
    const auto per_part = static_cast<size_t>(problems_per_part());
    uint64_t sum = 0;
    for (size_t j = p * per_part; j < (p + 1) * per_part; ++j)
      sum += 2 * static_cast<uint64_t>(m[j]) * static_cast<uint64_t>(n[j]) * static_cast<uint64_t>(k[j]);
    return sum;
  }
  uint64_t flops() const {
    uint64_t sum = 0;
    for (size_t p = 0; p < parts.size(); ++p) sum += part_flops(p);
    return sum;
  }
};
// The grouped GEMM in one call (gemm.cu): cuBLAS's grouped-batched GEMM for f32 and f64 operands, one
// group per problem since the experts' row counts differ (TF32 precision multiplies aligned f32 operands
// on the tensor cores); bf16 operands go to grouped_gemm_bf16. Returns false, having queued nothing,
// where bf16 operands are not rows that kernel takes; the caller then multiplies expert by expert.
bool grouped_gemm(const GroupedGemm& g, MatmulPrecision precision);
// The bf16 one (grouped_gemm_bf16.cu, lingtrain's own tensor-core kernel: cuBLAS's grouped call has no
// bf16-operand, f32-result form): a launch per part, for bf16 a and b whose rows are 16-byte multiples
// (grouped_gemm_bf16_takes) and g.pointers holding the problems' sizes too (rows m, n, k below a, b, c).
bool grouped_gemm_bf16_takes(const GroupedGemm& g);
void grouped_gemm_bf16(const GroupedGemm& g);

// c = alpha * op(a) @ op(b) + beta * c with the contract of kernels::matmul, f32 or f64, via cuBLAS;
// with BF16Inputs, f32 operands are rounded to bf16 (round_to_bf16) and multiplied on the tensor cores
// with f32 accumulation; with TF32, f32 operands go to the tensor cores as TF32 (f32 sums).
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision);
// c = op(a) @ op(b) + addend with the contract of kernels::matmul_add, in one cuBLASLt call whose epilogue
// reads the addend as it writes c (no pass of its own). False, having queued nothing, where the product
// is not one GEMM (a batched a against a batched b) or cuBLASLt offers no algorithm for it: the caller
// then multiplies and adds apart.
bool matmul_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& addend, Tensor& c,
                MatmulPrecision precision);

// y (bf16) = x (f32) rounded to nearest even, element by element (elementwise.cu).
void round_to_bf16(const Tensor& x, Tensor& y);
// x (f32) as a bf16 operand of a mixed-precision GEMM: its registered rounded copy where it has one (a
// weight during a training step: tensor/bf16_shadow.h), else rounded here into a new tensor; a bf16 x
// (an activation's copy kept for the backward) as it is.
Tensor bf16_operand(const Tensor& x);
// y (f32) = x (bf16), exactly (elementwise.cu).
void widen_bf16(const Tensor& x, Tensor& y);

// split_qkv_rope that also writes qkv_bf16 (where defined), qkv rounded to bf16 in the same pass: the copy
// autograd keeps of a fused projection that qkv_attention reads (rope.cu).
void split_qkv_rope_keeping(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v,
                            const Tensor& qkv_bf16);

}  // namespace lt::LT_CUDA_NAMESPACE
