// The CUDA backend: the kernels behind the front doors of tensor/kernels/<family>.cpp, a peer of the
// CPU backend (tensor/cpu/kernels.h). Each function has the contract of the lt::kernels function it
// serves (tensor/kernels.h) and checks nothing: the front door has checked shapes, dtypes and that
// every operand is on one device. They run on that device's default stream and return without waiting
// for the GPU (copies to the host wait).
//
// Declared whether or not the backend is compiled: the front doors call these only inside
// `if constexpr (kCudaBackend)` (tensor/kernels/dispatch.h), so a build without nvcc needs no definition.
//
// Adding a CUDA kernel: one .cu file (its device code and the Tensor-level function that launches it),
// the function's declaration here, the CUDA branch in its front door, and one entry in cuda_cases() of
// tests/cuda/test_cuda.cpp, which compares it with the CPU kernel on a GPU. Launched through
// LT_CUDA_LAUNCH and without cuBLAS, the kernel also runs on the CPU through tensor/cuda/emulation.h:
// its .cu file goes into tests/cuda/test_cuda_emulation.cpp, which compares it with the CPU kernel here.
#pragma once
#include <cstdint>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

// lt::cuda, or lt::cuda_emulated when a test compiles a .cu file as plain C++ (tensor/cuda/emulation.h).
#ifndef LT_CUDA_NAMESPACE
#define LT_CUDA_NAMESPACE cuda
#endif

namespace lt::LT_CUDA_NAMESPACE {

using kernels::BinaryOp;
using kernels::IndexRange;
using kernels::MatmulPrecision;
using kernels::OutOfRange;

// out[i] = a[i] op b[i % inner], f32 or f64 (elementwise.cu).
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, int64_t inner);

// y = alpha * x + beta * y, f32 or f64; beta == 0 means y is only written (elementwise.cu).
void axpby(double alpha, const Tensor& x, double beta, Tensor& y);

// axpby with alpha = factor * s[0], s one element on x's device (elementwise.cu).
void axpby_by(const Tensor& s, double factor, const Tensor& x, double beta, Tensor& y);

// out[j] = sum over the leading rows of x [rows, out.numel()] (elementwise.cu).
void sum_to(const Tensor& x, Tensor& out);

// Every element of t = value converted to t's dtype (any dtype; bf16 rounds to nearest even).
void fill(Tensor& t, double value);

// Sums of all elements, of their squares (f64 partials) and over the last dimension (reduce.cu).
void sum(const Tensor& x, Tensor& out);
void sum_squares(const Tensor& x, Tensor& out);
void sum_last_dim(const Tensor& x, Tensor& out);

// The mean of a loss over the targets that take part in it, on the device (reduce.cu).
void count_targets(const Tensor& targets, int64_t ignore_index, Tensor& count);
void mean_over_count(const Tensor& values, const Tensor& count, Tensor& mean);
void mean_over_count_backward(const Tensor& dmean, const Tensor& count, Tensor& dvalues);

// Copy a block of columns out of a matrix, or add one back in (slice.cu).
void copy_cols(const Tensor& src, int64_t start, Tensor& dst);
void add_to_cols(const Tensor& src, int64_t start, Tensor& dst);

// NormHead's inverse column norms of the head w [V, H] (normhead.cu).
void column_inv_norm(const Tensor& w, double eps, Tensor& inv_norm);

// SiLU and SwiGLU (silu(gate) * up), forward and backward, f32 or f64 (activation.cu).
void silu(const Tensor& x, Tensor& y);
void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup);
void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate, const Tensor& up, Tensor& t,
                             Tensor& h, Tensor& dup, Tensor& dw);

// RMSNorm over the last dim C, forward and backward (dw accumulated into), f32 or f64 (norm.cu).
void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd);
void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      bool add_to_dx);

// Softmax and log-softmax over the last dimension, forward and backward, f32 or f64 (softmax.cu).
void softmax(const Tensor& x, Tensor& y);
void log_softmax(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);

// Cross-entropy with ignore index, forward and backward; targets already checked (softmax.cu).
void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss, Tensor& lse);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const Tensor& lse,
                            const Tensor& dloss, Tensor& dlogits);

// Rotary position embedding and the split of a fused QKV projection with RoPE on q and k (rope.cu).
void rope(const Tensor& x, double theta, int64_t pos_offset, bool inverse, Tensor& y);
void split_qkv_rope(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v);
void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, double theta, int64_t pos_offset,
                             Tensor& dqkv);

// Causal grouped-query attention, flash-style, forward and backward, head dims up to
// kMaxAttentionHeadDim (the front door checks), doc_start optional (attention.cu).
inline constexpr int64_t kMaxAttentionHeadDim = 128;
void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start);
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start);
// The same from a fused QKV projection: on the GPU its parts in turn, the split with RoPE (rope.cu) and
// the kernels above (in the backward the split again, attention's backward and the split's backward).
void qkv_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start);
void qkv_attention_backward(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start);

// Attention for generation with a KV cache (attention_decode.cu), and the DPO loss (dpo.cu).
void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Tk, double scale, Tensor& out);
void dpo_loss(const Tensor& token_logp, const Tensor& response, const Tensor& counted, const Tensor& reference_logp,
              double beta, double rpo_alpha, Tensor& loss, Tensor& stats, Tensor& dtoken_logp);

// One AdamW step over a flat parameter, in place, f32 or f64 (adamw.cu).
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const kernels::AdamWStep& step);

// The first id of `ids` (i32 or i64) that `range` does not allow, found on the device and read back:
// the one call here that waits for the GPU, which a front door makes before it lets ids address memory
// (index.cu).
OutOfRange first_out_of_range(const Tensor& ids, const IndexRange& range);

// Row and column gathers and scatter-adds, top-k per row (index.cu), with the contracts of the
// kernels:: functions of the same names.
void gather_rows(const Tensor& table, const Tensor& idx, Tensor& out);
void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& out);
void topk(const Tensor& x, int64_t k, Tensor& values, Tensor& indices);
void gather_cols(const Tensor& x, const Tensor& idx, Tensor& out);
void scatter_add_cols(const Tensor& dout, const Tensor& idx, Tensor& dx);

// The MoE router, combine, statistics and dispatch, with the contracts of the kernels:: functions of
// the same names (moe.cu, moe_stats.cu). The ids they take were range-checked by the front door.
void router_topk(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& ids);
void router_topk_backward(const Tensor& probs, const Tensor& ids, bool renormalize, const Tensor& dweights,
                          double scale, Tensor& dlogits);
void router_aux_backward(const Tensor& probs, const Tensor& lse, const Tensor& counts, const Tensor& upstream,
                         double balance_scale, double z_scale, Tensor& dlogits);
void combine_rows(const Tensor& y, const Tensor& w, const Tensor& pos, Tensor& out, bool add_to_out);
void routing_warmup_observe(const Tensor& logits, double momentum, Tensor& stats);
void routing_warmup_noise(const Tensor& stats, const Tensor& eps, double alpha, Tensor& noise);
void router_aux_loss(const Tensor& probs, const Tensor& lse, const Tensor& ids, double balance_coef, double z_coef,
                     Tensor& counts, Tensor& balance, Tensor& z, Tensor& aux);
void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit);
void dispatch_plan(const Tensor& ids, Tensor& token_of, Tensor& position_of, Tensor& offsets);
void accumulate_f64(const Tensor& x, Tensor& sum);

// The grouped GEMMs over a dispatch's segments, via cuBLAS (gemm.cu); host_offsets is the front door's
// host copy of the segment offsets.
void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& host_offsets, Tensor& out,
                    double beta, MatmulPrecision precision);
void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& host_offsets, Tensor& dw, double beta,
                         MatmulPrecision precision);

// c = alpha * op(a) @ op(b) + beta * c with the contract of kernels::matmul, f32 or f64, via cuBLAS;
// with BF16Inputs, f32 operands are rounded to bf16 (round_to_bf16) and multiplied on the tensor cores
// with f32 accumulation.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision);

// y (bf16) = x (f32) rounded to nearest even, element by element (elementwise.cu).
void round_to_bf16(const Tensor& x, Tensor& y);
// y (f32) = x (bf16), exactly (elementwise.cu).
void widen_bf16(const Tensor& x, Tensor& y);

}  // namespace lt::LT_CUDA_NAMESPACE
