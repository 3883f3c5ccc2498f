// The CPU backend: the Highway kernels behind the front doors of tensor/kernels/<family>.cpp.
//
// Each function has the contract of the lt::kernels function of the same name (tensor/kernels.h) and
// checks nothing: the front door has checked dtypes, shapes, devices and index ranges. The vector
// code is compiled for every Highway target and chosen at run time (HWY_DYNAMIC_DISPATCH in each
// tensor/cpu/<family>.cc), so one binary runs the best instruction set of the machine it lands on.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace lt::cpu {

using kernels::AdamWStep;
using kernels::BinaryOp;
using kernels::GroupedProduct;
using kernels::GroupedWeightGrad;
using kernels::MatmulPrecision;

// ---- elementwise (elementwise.cc) ----------------------------------------------------------------
// out[i] = a[i] op b[i % inner].
void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out, int64_t inner);
// y = alpha * x + beta * y; beta == 0 means y is only written (scale and axpy).
void axpby(double alpha, const Tensor& x, double beta, Tensor& y);
// axpby with alpha = factor * s[0], s one element of x's dtype.
void axpby_by(const Tensor& s, double factor, const Tensor& x, double beta, Tensor& y);
void sum_to(const Tensor& x, Tensor& out);
void convert(const Tensor& x, Tensor& y);

// ---- reductions (reduce.cc) ----------------------------------------------------------------------
void sum(const Tensor& x, Tensor& out);
void sum_last_dim(const Tensor& x, Tensor& out);
void sum_squares(const Tensor& x, Tensor& out);

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
void matmul_gathered(const Tensor& a, const Tensor& a_rows, bool trans_a, const Tensor& b, const Tensor& b_rows,
                     bool trans_b, Tensor& c, double alpha, double beta, MatmulPrecision precision);
// True when this CPU multiplies bf16 natively (AVX512_BF16, tensor/cpu/bf16_dot.h).
bool bf16_matmul_available();
// The width in bytes of one row of the GEMM's packed B block (NC x the element size; the block is
// KC x NC) on a core with l2_bytes of L2: the block fits that L2, up to 1024 f32 columns.
int64_t gemm_column_block_bytes(int64_t l2_bytes);

// ---- activations (activation.cc) -----------------------------------------------------------------
void silu(const Tensor& x, Tensor& y);
void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
void swiglu(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup);
void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate, const Tensor& up, Tensor& t,
                             Tensor& h, Tensor& dup, Tensor& dw);

// ---- normalisation (norm.cc) ---------------------------------------------------------------------
void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd);
void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      bool add_to_dx);

// ---- softmax and cross-entropy (softmax.cc) ------------------------------------------------------
void softmax(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
void log_softmax(const Tensor& x, Tensor& y);
void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss, Tensor& lse);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            const Tensor& lse, const Tensor& dloss, Tensor& dlogits);
void count_targets(const Tensor& targets, int64_t ignore_index, Tensor& count);
void mean_over_count(const Tensor& values, const Tensor& count, Tensor& mean);
void mean_over_count_backward(const Tensor& dmean, const Tensor& count, Tensor& dvalues);

// ---- NormHead (normhead.cc) ----------------------------------------------------------------------
void column_inv_norm(const Tensor& w, double eps, Tensor& inv_norm);

// ---- rotary position embedding (rope.cc) ---------------------------------------------------------
void rope(const Tensor& x, double theta, int64_t pos_offset, bool inverse, Tensor& y);
// cos and sin of the angles of positions pos_offset .. pos_offset + seq - 1, [seq, D/2] each in the
// dtype: the calling thread's cached tables, valid until its next call with other arguments.
struct RopeTables {
  const void* cos = nullptr;
  const void* sin = nullptr;
};
RopeTables rope_tables(DType dtype, int64_t pos_offset, int64_t seq, int64_t D, double theta);
void split_qkv_rope(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v);
void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, double theta, int64_t pos_offset,
                             Tensor& dqkv);

// ---- attention (attention.cc, attention_decode.cc) -----------------------------------------------
void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start);
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start);
void qkv_attention(const Tensor& qkv, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start);
void qkv_attention_backward(const Tensor& qkv, int64_t Hq, int64_t Hkv, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start);
void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Tk, double scale, Tensor& out);

// ---- indexing (index.cc) -------------------------------------------------------------------------
void gather_rows(const Tensor& table, const Tensor& idx, Tensor& out);
void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& out);
void topk(const Tensor& x, int64_t k, Tensor& values, Tensor& indices);
void gather_cols(const Tensor& x, const Tensor& idx, Tensor& out);
void scatter_add_cols(const Tensor& dout, const Tensor& idx, Tensor& dx);

// ---- MoE routing and combine (moe.cc) ------------------------------------------------------------
void router_topk(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& ids);
void router_topk_backward(const Tensor& probs, const Tensor& ids, bool renormalize, const Tensor& dweights,
                          double scale, Tensor& dlogits);
void router_aux_backward(const Tensor& probs, const Tensor& lse, const Tensor& counts, const Tensor& upstream,
                         double balance_scale,
                         double z_scale, Tensor& dlogits);
void combine_rows(const Tensor& y, const Tensor& w, const Tensor& pos, Tensor& out, bool add_to_out);

// ---- optimiser (adamw.cc) ------------------------------------------------------------------------
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step);

// ---- column slices (slice.cc) --------------------------------------------------------------------
void copy_cols(const Tensor& src, int64_t start, Tensor& dst);
void add_to_cols(const Tensor& src, int64_t start, Tensor& dst);

// ---- MoE statistics and dispatch (moe_stats.cc) ---------------------------------------------------
void routing_warmup_observe(const Tensor& logits, double momentum, Tensor& stats);
void routing_warmup_noise(const Tensor& stats, const Tensor& eps, double alpha, Tensor& noise);
void router_aux_loss(const Tensor& probs, const Tensor& lse, const Tensor& ids, double balance_coef, double z_coef,
                     Tensor& counts, Tensor& balance, Tensor& z, Tensor& aux);
void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit);
void dispatch_plan(const Tensor& ids, Tensor& token_of, Tensor& position_of, Tensor& offsets);
void grouped_matmuls(const std::vector<GroupedProduct>& products, const Tensor& offsets, MatmulPrecision precision);
void grouped_weight_grads(const std::vector<GroupedWeightGrad>& grads, const Tensor& offsets,
                          MatmulPrecision precision);
void accumulate_f64(const Tensor& x, Tensor& sum);

// ---- preference loss (dpo.cc) --------------------------------------------------------------------
void dpo_loss(const Tensor& token_logp, const Tensor& response, const Tensor& counted, const Tensor& reference_logp,
              double beta, double rpo_alpha, Tensor& loss, Tensor& stats, Tensor& dtoken_logp);

}  // namespace lt::cpu
