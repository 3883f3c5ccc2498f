// The differentiable ops. Each takes and returns Variables, computes its forward with the kernels of
// tensor/kernels.h, and records a Node whose backward sits next to the forward in autograd/ops/<family>.cpp.
// Shapes follow the kernels: see tensor/kernels.h for the exact contracts.
#pragma once
#include <cstdint>
#include <functional>

#include "autograd/variable.h"

namespace lt {

// ---- elementwise (autograd/ops/elementwise.cpp): b broadcasts over the leading dims of a ----------
Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable scale(const Variable& x, double alpha);

// ---- shape and reductions (autograd/ops/reduce.cpp) ----------------------------------------------
Variable reshape(const Variable& x, const Shape& shape);  // a view; the gradient is reshaped back
// x itself, whose backward first calls `before` and passes the gradient on unchanged: parameter sharding
// gathers a layer's weights there again, before the backward of the layer that made x (dist/parameter_shards.h).
Variable call_before_backward(const Variable& x, std::function<void()> before);
// Columns [start, start + width) of the last dimension (a copy; backward adds into those columns).
Variable slice_cols(const Variable& x, int64_t start, int64_t width);
Variable sum(const Variable& x);                          // scalar [1]
Variable mean(const Variable& x);                         // scalar [1]

// ---- matmul (autograd/ops/matmul.cpp) -------------------------------------------------------------
Variable matmul(const Variable& a, const Variable& b, bool trans_a = false, bool trans_b = false);
// addend + op(a) op(b), addend of the product's shape, summed as the GEMM writes the product (one pass
// over the result fewer than matmul then add, with the same bits).
Variable matmul_add(const Variable& a, const Variable& b, const Variable& addend, bool trans_a = false,
                    bool trans_b = false);

// ---- activations (autograd/ops/activation.cpp) ----------------------------------------------------
Variable silu(const Variable& x);
// silu(gate) * up of a fused projection gate_up [..., 2C]: gate its first C columns, up its last C.
Variable swiglu(const Variable& gate_up);

// ---- normalisation (autograd/ops/norm.cpp) --------------------------------------------------------
Variable rmsnorm(const Variable& x, const Variable& weight, double eps);
// The residual stream joining its norm: sum = a + b (equal shapes) and normed = rmsnorm(sum, weight, eps) in
// one pass, with the bits and the backward of add then rmsnorm.
struct AddRmsNorm {
  Variable sum, normed;
};
AddRmsNorm add_rmsnorm(const Variable& a, const Variable& b, const Variable& weight, double eps);

// ---- softmax and losses (autograd/ops/softmax.cpp) ------------------------------------------------
Variable softmax(const Variable& x);      // over the last dim
Variable log_softmax(const Variable& x);  // over the last dim
// Mean cross-entropy of logits [N, V] against targets [N] (i32/i64) over the targets that are not
// ignore_index; scalar [1]. 0 when every target is ignored.
Variable cross_entropy(const Variable& logits, const Tensor& targets, int64_t ignore_index = -100);

// ---- position and attention (autograd/ops/rope.cpp, autograd/ops/attention.cpp) -------------------
Variable rope(const Variable& x, double theta, int64_t pos_offset = 0);  // x [B, T, H, D]
// Causal grouped-query attention, q [B, T, Hq, D], k and v [B, T, Hkv, D] -> [B, T, Hq, D],
// scores scaled by 1/sqrt(D). doc_start (i32 [B, T], optional): packed documents, query t seeing keys
// doc_start[b, t] .. t only (kernels::attention).
Variable attention(const Variable& q, const Variable& k, const Variable& v, const Tensor& doc_start = Tensor());
// The same from a fused projection qkv [B, T, (Hq + 2 Hkv) D] whose rows are [all Q heads | all K heads
// | all V heads]: RoPE (theta, positions from pos_offset) on q and k, then attention -> [B, T, Hq, D].
// Equal to attention(rope(q), rope(k), v) of the three column blocks, in one split pass each way.
Variable qkv_attention(const Variable& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset = 0,
                       const Tensor& doc_start = Tensor());

// ---- indexing (autograd/ops/index.cpp) -------------------------------------------------------------
Variable embedding(const Variable& table, const Tensor& ids);  // table [V, C], ids any shape -> ids.shape + [C]
Variable gather_rows(const Variable& x, const Tensor& idx);    // x [R, C], idx [N] -> [N, C]
Variable scatter_add_rows(const Variable& src, const Tensor& idx, int64_t rows);  // -> [rows, C]
Variable gather_cols(const Variable& x, const Tensor& idx);    // x [N, E], idx [N, K] i32 -> [N, K]
struct TopK {
  Variable values;  // [N, k], differentiable (a gather of x)
  Tensor indices;   // [N, k] i32
};
TopK topk(const Variable& x, int64_t k);

}  // namespace lt
