// The kernel interface: every numeric routine the layers above call, device-dispatched.
//
// Each op family has one front door, tensor/kernels/<family>.cpp: it checks the operands (shapes,
// dtypes, one device) and runs the kernel of the operands' device, from one of two peer backends that
// check nothing themselves: the CPU kernels of tensor/cpu/<family>.cc (Highway, dynamic dispatch, f32
// and f64) and the CUDA kernels of tensor/cuda/<family>.cu (every op has one; cuBLAS for the GEMMs).
// Index operands are range-checked on their own device before a kernel lets them address memory. Outputs
// are passed in, already allocated, so callers decide where memory comes from. Forward and backward of a
// family sit side by side.
//
// Determinism: for a given thread count, every kernel returns bit-identical results run after run
// (work is split by lt::parallel_for, reductions combine chunk results in chunk order, no atomics; the
// CUDA kernels likewise reduce in a fixed order and use no atomics).
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace lt::kernels {

// ---- elementwise (tensor/kernels/elementwise.cpp) -----------------------------------------------
// Binary ops broadcast `b` over the leading dimensions of `a`: b's shape must equal a trailing part
// of a's shape (b = [C] against a = [B, T, C], or b the same shape as a). out has a's shape.
void add(const Tensor& a, const Tensor& b, Tensor& out);
void sub(const Tensor& a, const Tensor& b, Tensor& out);
void mul(const Tensor& a, const Tensor& b, Tensor& out);
void scale(const Tensor& x, double alpha, Tensor& out);  // out = alpha * x (out may be x)
void axpy(double alpha, const Tensor& x, Tensor& y);     // y += alpha * x, same shapes
// The same with the factor alpha * s[0] read from a one-element tensor s on x's device (an upstream
// gradient) where the data lives, so a backward never waits for the host to read it.
void scale_by(const Tensor& x, const Tensor& s, double alpha, Tensor& out);
void axpy_by(const Tensor& s, double alpha, const Tensor& x, Tensor& y);
// Sums `x` over its leading dimensions down to out's shape (a trailing part of x's shape): the
// backward of broadcasting.
void sum_to(const Tensor& x, Tensor& out);
// y = x in y's dtype, between f32 and bf16: rounded to nearest even (f32 -> bf16, as Tensor::to) or
// widened exactly (bf16 -> f32). Same shape and device.
void convert(const Tensor& x, Tensor& y);

// ---- reductions (tensor/kernels/reduce.cpp) -----------------------------------------------------
void sum(const Tensor& x, Tensor& out);           // all elements -> out of one element
void sum_last_dim(const Tensor& x, Tensor& out);  // [..., N] -> [...]
void sum_squares(const Tensor& x, Tensor& out);   // sum of x^2 -> one element (gradient norms)

// ---- matrix multiply (tensor/kernels/gemm.cpp) --------------------------------------------------
// c = alpha * op(a) @ op(b) + beta * c, op = transpose when the flag is set (of the last two dims).
// a: [M, K] ([K, M] transposed) or batched [G, M, K]; b: [K, N] ([N, K] transposed) or [G, K, N];
// c: [M, N] or [G, M, N]. A 2-D b against a batched a applies b to every batch. A 3-D a with a 2-D b
// and no transpose of a is one [G*M, K] GEMM.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha = 1.0,
            double beta = 0.0);
// c = op(a) @ op(b) + addend (c's shape, apart from c): the residual stream joining a projection in the
// pass that writes the product, with the bits of matmul then add (each product complete, then the addend).
void matmul_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& addend, Tensor& c);
// The precision of every later matmul (and grouped matmul) of f32 tensors: process-wide, set once per
// run (--dtype bf16). On the CPU, BF16Inputs takes effect where cpu_has_bf16_matmul() and matmuls of
// more than 12 rows (the rest stay f32); f64 is always exact.
void set_matmul_precision(MatmulPrecision precision);
MatmulPrecision matmul_precision();
// True when this CPU has a bf16 GEMM (AVX512_BF16: Zen 4, Sapphire Rapids and later).
bool cpu_has_bf16_matmul();
// What the bf16 GEMM multiplies on: "AMX tiles" (Xeons from Sapphire Rapids on, tensor/cpu/amx.h),
// "AVX512_BF16" (VDPBF16PS), or nullptr where there is no bf16 GEMM.
const char* cpu_bf16_matmul_unit();

// ---- activations (tensor/kernels/activation.cpp) ------------------------------------------------
void silu(const Tensor& x, Tensor& y);                                  // x * sigmoid(x)
void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx);
// SwiGLU: y = silu(gate) * up, same shapes.
void swiglu(const Tensor& gate, const Tensor& up, Tensor& y);
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate, Tensor& dup);

// ---- normalisation (tensor/kernels/norm.cpp) ----------------------------------------------------
// RMSNorm over the last dim C: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), kept for backward.
// x, y: [N, C] (any leading shape), w: [C], rstd: [N] (leading shape).
void rmsnorm(const Tensor& x, const Tensor& w, double eps, Tensor& y, Tensor& rstd);
// dw is accumulated into (+=), so micro-batches or shared weights can add up; zero it first. dx_beta 0
// writes dx; 1 adds to it (the residual stream's gradient, which x's other use has begun), each element
// its own value rounded, then the sum rounded: the bits of writing it apart and adding. dx may share no
// memory with the other operands (checked).
void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dw,
                      double dx_beta = 0.0);

// ---- softmax and cross-entropy (tensor/kernels/softmax.cpp) -------------------------------------
// Over the last dimension.
void softmax(const Tensor& x, Tensor& y);
void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
void log_softmax(const Tensor& x, Tensor& y);
void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx);
// Per-row cross-entropy of logits [N, V] against integer targets [N] (i32 or i64):
// loss[n] = logsumexp(logits[n]) - logits[n, target[n]], 0 where target == ignore_index. lse [N] is kept
// for backward. Targets outside [0, V) that are not ignore_index are an error.
void cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, Tensor& loss,
                   Tensor& lse);
// dlogits[n] = dloss[n] * (softmax(logits[n]) - onehot(target[n])), zero rows for ignored targets.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                            const Tensor& lse, const Tensor& dloss, Tensor& dlogits);
// The mean of a loss over the targets that take part in it, formed where the tensors live, so a GPU
// step reads nothing back to the host. count [1] (i64) = the number of targets (i32 or i64, any shape)
// that are not ignore_index.
void count_targets(const Tensor& targets, int64_t ignore_index, Tensor& count);
// mean [1] = sum(values) * (1 / count), 0 when count is 0 (a fully ignored batch has loss 0).
void mean_over_count(const Tensor& values, const Tensor& count, Tensor& mean);
// Its backward: every element of dvalues = dmean / count, 0 when count is 0. dmean [1].
void mean_over_count_backward(const Tensor& dmean, const Tensor& count, Tensor& dvalues);

// ---- preference loss (tensor/kernels/dpo.cpp) ---------------------------------------------------
// Sigmoid DPO (Rafailov et al. 2023) with Ling's NLL term on the chosen response, from per-token
// log-probabilities token_logp [N] (the policy's, as normhead_token_logprobs gives them):
//   response [N] i32: 2p for a token of pair p's chosen response, 2p + 1 for its rejected one, -1 for
//     any other token; counted [N] i32: nonzero where the token enters the DPO log-prob (all response
//     tokens, or only those that differ in format for format-recovery DPO);
//   logp[j] = sum of token_logp[n] over counted n with response[n] = j       (f64, in row order)
//   r_w = beta (logp[2p] - ref[2p]), r_l = beta (logp[2p+1] - ref[2p+1])      ref = reference_logp [2P] f64
//   loss [1] = mean_p softplus(r_l - r_w) + rpo_alpha * nll,  nll = -(sum of token_logp over every
//     chosen-response token) / their count (0 without any)
// stats [kDpoStats] f64: the sums over pairs (and tokens) that TRL's metrics are means of, by DpoStat.
// With dtoken_logp defined it receives d loss / d token_logp at an upstream gradient of 1 (the loss is a
// scalar, so the backward only scales it). P = 0 gives loss 0.
enum DpoStat {
  kDpoRewardChosen, kDpoRewardRejected, kDpoCorrect, kDpoMargin, kDpoLogpChosen, kDpoLogpRejected,
  kDpoLoss, kDpoNllSum, kDpoNllTokens, kDpoPairs, kDpoStats
};
void dpo_loss(const Tensor& token_logp, const Tensor& response, const Tensor& counted, const Tensor& reference_logp,
              double beta, double rpo_alpha, Tensor& loss, Tensor& stats, Tensor& dtoken_logp);

// ---- NormHead (tensor/kernels/normhead.cpp) -----------------------------------------------------
// inv_norm[j] = 1 / (sqrt(sum_v w[v, j]^2) + eps) for the head w [V, H] (sums in f64, row order).
void column_inv_norm(const Tensor& w, double eps, Tensor& inv_norm);

// ---- rotary position embedding (tensor/kernels/rope.cpp) ----------------------------------------
// x: [B, T, H, D] with D even, rotate-half (NeoX) convention: element i < D/2 pairs with i + D/2 at
// frequency theta^(-2i/D), position = pos_offset + t. inverse = true rotates by -angle (the backward).
void rope(const Tensor& x, double theta, int64_t pos_offset, bool inverse, Tensor& y);
// The split of a fused QKV projection for attention: qkv [B, T, (Hq + 2 Hkv) D] holds per position
// [all Q heads | all K heads | all V heads]; q [B, T, Hq, D] and k [B, T, Hkv, D] are rope() of their
// blocks, v [B, T, Hkv, D] a copy of its block. The backward writes every element of dqkv from dq and
// dk (rotated back) and dv.
void split_qkv_rope(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v);
void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, double theta, int64_t pos_offset,
                             Tensor& dqkv);

// ---- attention (tensor/kernels/attention.cpp, attention_decode.cpp) -----------------------------
// Causal scaled-dot-product attention with grouped-query heads.
// q: [B, T, Hq, D], k and v: [B, T, Hkv, D], Hq a multiple of Hkv (query head h reads kv head
// h / (Hq / Hkv)). out: [B, T, Hq, D]; lse: [B, Hq, T] f32/f64 log-sum-exp of each score row, kept
// for backward. scale multiplies the scores (1/sqrt(D) in Ling).
// doc_start (optional, i32 [B, T]): documents packed into one row, doc_start[b, t] the position where
// token t's document begins; query t then sees keys doc_start[b, t] .. t only. Undefined: keys 0 .. t.
// The outputs (out and lse; dq, dk and dv) are summed into as the inputs are read, so none may share
// memory with an input or with another output (checked).
void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start = Tensor());
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dout, double scale, Tensor& dq, Tensor& dk,
                        Tensor& dv, const Tensor& doc_start = Tensor());

// Attention straight from a fused QKV projection: qkv [B, T, (Hq + 2 Hkv) D] as split_qkv_rope takes
// it, with D even. The same as split_qkv_rope then attention (and the backward: attention_backward then
// split_qkv_rope_backward into dqkv), with the same bits on the CPU, where q and k are turned by RoPE as
// attention gathers their blocks, and the gradients written into dqkv's columns and turned back there:
// no q, k, v, dq, dk or dv tensors, and no pass over memory for the split either way.
void qkv_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start = Tensor());
void qkv_attention_backward(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start = Tensor());

// Inference with a KV cache: q [B, Tq, Hq, D] holds the newest Tq positions of a sequence whose keys
// and values (cache included) are the first Tk positions of k, v [B, capacity, Hkv, D] (Tk <= capacity,
// Tk >= Tq). Query i sits at position Tk - Tq + i and attends keys 0 .. Tk - Tq + i. No backward.
void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Tk, double scale, Tensor& out);

// ---- indexing (tensor/kernels/index.cpp) --------------------------------------------------------
// out[n, :] = table[idx[n], :]; table [R, C], idx [N] i32/i64 (any leading shape), out [N, C]
// (idx's shape + [C]). An index outside [0, R) is an error naming the index and R.
void gather_rows(const Tensor& table, const Tensor& idx, Tensor& out);
// out[idx[n], :] += src[n, :], deterministic (rows are summed in n order). The backward of gather_rows
// and of the embedding lookup.
void scatter_add_rows(const Tensor& src, const Tensor& idx, Tensor& out);
// The k largest values of each row of x [N, E] and their column indices (i32), in descending order;
// ties go to the lower index. Not differentiable itself: gradients flow through gather of values.
void topk(const Tensor& x, int64_t k, Tensor& values, Tensor& indices);
// out[n, j] = x[n, idx[n, j]] for x [N, E], idx [N, K] i32 -> out [N, K]; and its backward,
// dx[n, idx[n, j]] += dout[n, j] (dx must be zeroed by the caller).
void gather_cols(const Tensor& x, const Tensor& idx, Tensor& out);
void scatter_add_cols(const Tensor& dout, const Tensor& idx, Tensor& dx);

// ---- MoE routing and combine (tensor/kernels/moe.cpp) -------------------------------------------
// The router after its projection, per row of logits [N, E]: probs = softmax(logits) [N, E], lse [N]
// their log-sum-exp, ids [N, k] i32 the k most probable experts in descending order (ranked as topk
// does), weights [N, k] their probabilities, divided by their sum when `renormalize`.
void router_topk(const Tensor& logits, int64_t k, bool renormalize, Tensor& probs, Tensor& lse, Tensor& weights,
                 Tensor& ids);
// dlogits = scale * (d weights / d logits)^T dweights, through the renormalisation and the softmax.
void router_topk_backward(const Tensor& probs, const Tensor& ids, bool renormalize, const Tensor& dweights,
                          double scale, Tensor& dlogits);
// The gradient, with respect to the logits, of g (balance_scale * sum_{n,e} probs[n, e] counts[e] plus
// z_scale / 2 * sum_n lse[n]^2) (the load-balance and z losses, their constant factors folded in), g the
// upstream gradient [1] of the loss, read by the kernel (no host round trip in the backward):
//   dlogits[n, e] = g probs[n, e] (balance_scale (counts[e] - sum_f probs[n, f] counts[f]) + z_scale lse[n]).
void router_aux_backward(const Tensor& probs, const Tensor& lse, const Tensor& counts, const Tensor& upstream,
                         double balance_scale, double z_scale, Tensor& dlogits);
// The weighted combine of the experts' outputs: out[n, :] = sum_j w[n, j] * y[pos[n k + j], :] for
// y [M = N k, C] (rows in expert order), w [N, k], pos [N k] i32 (where each assignment's row sits in y),
// summed in j order. out_beta 1 adds that sum to what out holds (the experts' dx into a gradient begun by
// x's other uses), with the bits of the sum apart plus out; out may then share no memory with y.
void combine_rows(const Tensor& y, const Tensor& w, const Tensor& pos, Tensor& out, double out_beta = 0.0);
// The combine's backward with the routed experts' SwiGLU backward folded in, taken before their down
// projection y = h W_down^T, h = silu(gate) up (gate, up, t, h, dup [M, I], rows in expert order). On
// entry t = g_M W_down, the gradient of h at weight 1. Per assignment a at row m = pos[a] (w [N, k], pos
// [N k] i32, a permutation of the rows), with h_m = silu(gate[m]) up[m] and dy = w[a] t[m]:
//   dw[a] = dot(t[m], h_m) (= dot(g, y[m])) where dw is defined,
//   h[m] = w[a] h_m, the down projection's input as the combine weighs it (dL/dW_down = g_M^T h),
//   t[m] and dup[m] = swiglu_backward's dgate and dup of dy (t is overwritten).
// One pass over memory: it reads gate, up and t and writes t, h and dup, which have the bits of swiglu
// and swiglu_backward (tensor/cpu/activation.cc). t, h and dup may share no memory with gate, up, w or
// each other.
void swiglu_combine_backward(const Tensor& w, const Tensor& pos, const Tensor& gate, const Tensor& up, Tensor& t,
                             Tensor& h, Tensor& dup, Tensor& dw);

// ---- optimiser (tensor/kernels/adamw.cpp) -------------------------------------------------------
// One AdamW step over a flat parameter, in place (PyTorch's formulation, decoupled weight decay), with
// g = grad_scale * grad (gradient clipping folded into the pass):
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
// AdamWStep (tensor/kernel_types.h) holds lr, beta1, beta2, eps, weight_decay, t and grad_scale.
void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWStep& step);

// ---- column slices (tensor/kernels/slice.cpp) ---------------------------------------------------
// dst [N, W] = src[:, start : start + W] for src [N, C]; and dst[:, start : start + W] += src, its
// backward. Used to split a fused projection (QKV) without general strides.
void copy_cols(const Tensor& src, int64_t start, Tensor& dst);
void add_to_cols(const Tensor& src, int64_t start, Tensor& dst);

// ---- MoE statistics and dispatch (tensor/kernels/moe_stats.cpp) --------------------------------
// What the router, the dispatch and the metrics need from one routing, computed on the routing's device
// so that a training step never waits for the host. The sums run in f64 in element order on one
// thread: they touch O(N E) values, and the fixed order keeps them independent of the thread count
// (and equal to the host loops they replaced).

// The routing-warmup statistics, updated in place: stats f64 [3] = [mean, std, observed (0 or 1)].
// With m and s the mean and the population standard deviation of all of logits (two passes, in f64):
// the first observation sets [m, s, 1]; later ones move mean and std by an exponential moving average,
// mean = momentum mean + (1 - momentum) m (std likewise). Empty logits leave stats as they are.
void routing_warmup_observe(const Tensor& logits, double momentum, Tensor& stats);
// The noise half of the warmup mixing: noise = (1 - alpha)(mean + std eps) per element, in f64 and
// rounded once to noise's dtype, with mean and std read from stats [3] and eps f64 of noise's shape.
void routing_warmup_noise(const Tensor& stats, const Tensor& eps, double alpha, Tensor& noise);
// The router's auxiliary losses from probs [N, E], lse [N] and the chosen ids [N, k] i32:
//   counts [E]  assignments per expert, in probs' dtype (exact: N k is checked to fit its integers),
//               the constant that router_aux_backward reads;
//   balance [1] f64 = E / (N^2 k) sum_{n,e} probs[n, e] counts[e]  (Switch/GShard, 1 at perfect balance);
//   z [1] f64       = (1/N) sum_n lse[n]^2                         (ST-MoE z-loss);
//   aux [1]         = balance_coef balance + z_coef z, in f64 then probs' dtype.
void router_aux_loss(const Tensor& probs, const Tensor& lse, const Tensor& ids, double balance_coef, double z_coef,
                     Tensor& counts, Tensor& balance, Tensor& z, Tensor& aux);
// The mean routing entropy in nats, entropy [1] f64 = (1/N) sum_n (lse[n] - sum_e probs[n, e] logits[n, e])
// (= -sum_e p log p, since log p = logits - lse), and max_logit [1] f64, the largest of logits [N, E].
void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit);
// Dropless dispatch of ids [N, k] i32 over E = offsets.numel() - 1 experts by a stable counting sort:
// offsets [E + 1] i64 (expert e owns sorted rows [offsets[e], offsets[e + 1])), token_of [N k] i32 (the
// token of each sorted row) and position_of [N k] i32 (the sorted row of assignment n k + j). Stable:
// within an expert, rows keep (token, slot) order. An id outside [0, E) is an error.
void dispatch_plan(const Tensor& ids, Tensor& token_of, Tensor& position_of, Tensor& offsets);
// The grouped GEMM over the segments of a dispatch: for each expert e with rows R_e of offsets,
// out[R_e] = a[R_e] w[e]^T (trans_w, w [E, N, K]) or a[R_e] w[e] (w [E, K, N]), plus beta out[R_e].
// A GroupedProduct (GroupedWeightGrad) with a_rows (b_rows) reads row m of that operand from its row
// a_rows[m]: the tokens' rows in dispatch order, without a copy (the CPU GEMM reads them through the
// index as it packs; the CUDA path gathers them first).
void grouped_matmul(const Tensor& a, const Tensor& w, bool trans_w, const Tensor& offsets, Tensor& out,
                    double beta = 0.0);
// Several grouped GEMMs over the same segments, taken expert by expert: expert e's products run back to
// back in list order, so an operand they share (a, or an out that a later product adds to) is still in
// cache for the second one. The same results as one grouped_matmul per product, in list order.
void grouped_matmuls(const std::vector<GroupedProduct>& products, const Tensor& offsets);
// Each expert's weight gradient dw[e] = a[R_e]^T b[R_e] for dw [E, *, *], written (beta = 0) or added to
// what dw holds (beta = 1, a gradient buffer); an expert with no rows contributes zero.
void grouped_weight_grad(const Tensor& a, const Tensor& b, const Tensor& offsets, Tensor& dw, double beta);
// Several weight gradients over the same segments, expert by expert, as grouped_matmuls.
void grouped_weight_grads(const std::vector<GroupedWeightGrad>& grads, const Tensor& offsets);
// sum += x elementwise, x f32 or f64 and sum f64 with x's element count: running totals of per-layer
// statistics kept in double, so that f32 values add up as they would on the host.
void accumulate_f64(const Tensor& x, Tensor& sum);

}  // namespace lt::kernels

namespace lt {
// The Highway target the CPU kernels dispatch to on this machine ("AVX3_DL", "AVX2", ...).
const char* cpu_kernel_target();
// The L2 cache of one core of this machine in bytes, read once: the level-2 data or unified cache in
// /sys/devices/system/cpu/cpu0/cache, else sysconf; 1 MiB when neither says. The GEMM sizes its packed
// blocks by it (tensor/cpu/gemm.cc).
int64_t cpu_l2_cache_bytes();
// Caps the CPU kernels at the Highway target named by the environment variable LINGTRAIN_CPU_TARGET
// (any case), if it is set: from then on they dispatch to the newest target no newer than it. For
// measuring and testing an older CPU's code path (AVX2, as on Zen 3) on a newer one. Called at start-up,
// before any kernel runs; throws on a name this build has no target for and on one this CPU cannot run.
// Reads LINGTRAIN_CPU_AMX as well (0: the bf16 GEMM keeps off a Xeon's AMX tiles; 1 or unset: it uses
// them where the CPU has them; anything else throws).
void cap_cpu_target_from_environment();
}  // namespace lt
