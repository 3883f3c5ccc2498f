// The attention front doors: causal grouped-query attention, forward and backward.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// Checks the shapes shared by forward and backward: q [B, T, Hq, D], k and v [B, T, Hkv, D], out like q,
// lse [B, Hq, T]; the callers check the dtypes.
void check_attention_shapes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse) {
  LT_CHECK(q.ndim() == 4, op, ": q must be [B, T, Hq, D], got ", q.str());
  LT_CHECK(k.ndim() == 4, op, ": k must be [B, T, Hkv, D], got ", k.str());
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), D = q.dim(3), Hkv = k.dim(2);
  LT_CHECK(k.dim(0) == B && k.dim(1) == T && k.dim(3) == D, op, ": k ", k.str(), " differs from q ", q.str(),
           " in batch, length or head dim");
  LT_CHECK(Hkv > 0 && Hq % Hkv == 0, op, ": query heads (", Hq, ") must be a multiple of kv heads (", Hkv, ")");
  LT_CHECK(D > 0, op, ": head dim must be positive, got ", q.str());
  check_shape(v, k.shape(), op, "v");
  check_shape(out, q.shape(), op, "out");
  check_shape(lse, {B, Hq, T}, op, "lse");
  if (!q.is_cpu())
    LT_CHECK(D <= cuda::kMaxAttentionHeadDim, op, ": the CUDA kernel takes head dims up to ",
             cuda::kMaxAttentionHeadDim, ", got ", q.str());
}

// doc_start, when given: i32 [B, T] on q's device, each row a run of documents: 0 first, then every
// entry either its predecessor's value (the same document) or its own position (a new document
// starts). Checked on the host: a CUDA doc_start ([B, T], small next to q) is copied there first.
void check_doc_start(const char* op, const Tensor& doc_start, const Tensor& q) {
  if (!doc_start.defined()) return;
  LT_CHECK(doc_start.dtype() == DType::I32, op, ": doc_start must be i32, got ", doc_start.str());
  check_shape(doc_start, {q.dim(0), q.dim(1)}, op, "doc_start");
  check_device(doc_start, q, op, "doc_start");
  const Tensor host = doc_start.to(Device::cpu());
  const int64_t B = q.dim(0), T = q.dim(1);
  const int32_t* start = host.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = start[b * T + t];
      LT_CHECK(t == 0 ? s == 0 : (s == start[b * T + t - 1] || s == t), op, ": doc_start[", b, ", ", t, "] = ", s,
               " is neither the previous entry nor the position (documents must be contiguous runs)");
    }
}

// The shapes of the fused projection qkv [B, T, (Hq + 2 Hkv) D] and of what comes out of attention over
// it: out [B, T, Hq, D] and lse [B, Hq, T]; the callers check the dtypes.
void check_qkv_attention_shapes(const char* op, const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta,
                                int64_t pos_offset, const Tensor& out, const Tensor& lse) {
  LT_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, op, ": query heads (", heads,
           ") must be a positive multiple of kv heads (", kv_heads, ")");
  LT_CHECK(qkv.ndim() == 3 && qkv.dim(2) % (heads + 2 * kv_heads) == 0, op, ": qkv ", qkv.str(), " is not [B, T, (",
           heads, " + 2 * ", kv_heads, ") * head_dim]");
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (heads + 2 * kv_heads);
  LT_CHECK(D > 0 && D % 2 == 0, op, ": head dim must be positive and even for RoPE, got ", D);
  LT_CHECK(theta > 0 && pos_offset >= 0, op, ": theta must be positive and pos_offset >= 0");
  check_shape(out, {B, T, heads, D}, op, "out");
  check_shape(lse, {B, heads, T}, op, "lse");
  if (!qkv.is_cpu())
    LT_CHECK(D <= cuda::kMaxAttentionHeadDim, op, ": the CUDA kernel takes head dims up to ",
             cuda::kMaxAttentionHeadDim, ", got ", D);
}

}  // namespace

// The kernels sum into their outputs as they go (tensor/cpu/attention.cc), reading q, k, v (and out,
// lse, dout) all the while, hence check_outputs_apart.
void attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale, Tensor& out, Tensor& lse,
               const Tensor& doc_start) {
  check_float(q, "attention", "q");
  check_like(k, q, "attention", "k");
  check_like(v, q, "attention", "v");
  check_like(out, q, "attention", "out");
  check_like(lse, q, "attention", "lse");
  check_attention_shapes("attention", q, k, v, out, lse);
  check_doc_start("attention", doc_start, q);
  check_outputs_apart("attention", {{&out, "out"}, {&lse, "lse"}}, {{&q, "q"}, {&k, "k"}, {&v, "v"}});
  if constexpr (kCudaBackend) {
    if (!q.is_cpu()) return cuda::attention(q, k, v, scale, out, lse, doc_start);
  }
  cpu::attention(q, k, v, scale, out, lse, doc_start);
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, double scale, Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& doc_start) {
  const char* op = "attention_backward";
  // q, k, v and out as autograd kept them (check_kept_anywhere): q, k and v alike, since the kernels read
  // the three as one element type, and on a CPU out too.
  check_float(dout, op, "dout");
  check_kept_anywhere(q, dout, op, "q");
  check_like(k, q, op, "k");
  check_like(v, q, op, "v");
  check_kept_anywhere(out, dout, op, "out");
  if (q.is_cpu()) check_like(out, q, op, "out");
  check_like(lse, dout, op, "lse");
  check_attention_shapes(op, q, k, v, out, lse);
  check_doc_start(op, doc_start, q);
  check_shape(dout, q.shape(), op, "dout");
  check_same(dq, dout, op, "dq");
  check_like(dk, dout, op, "dk");
  check_shape(dk, k.shape(), op, "dk");
  check_same(dv, dk, op, "dv");
  check_outputs_apart(op, {{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}},
                      {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&lse, "lse"}, {&dout, "dout"}});
  if constexpr (kCudaBackend) {
    if (!q.is_cpu()) return cuda::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, doc_start);
  }
  cpu::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, doc_start);
}

void qkv_attention(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset, double scale,
                   Tensor& out, Tensor& lse, const Tensor& doc_start, const Tensor& qkv_bf16, const Tensor& out_bf16) {
  const char* op = "qkv_attention";
  check_float(qkv, op, "qkv");
  check_like(out, qkv, op, "out");
  check_like(lse, qkv, op, "lse");
  check_qkv_attention_shapes(op, qkv, heads, kv_heads, theta, pos_offset, out, lse);
  check_doc_start(op, doc_start, qkv);
  check_outputs_apart(op, {{&out, "out"}, {&lse, "lse"}}, {{&qkv, "qkv"}});
  if (qkv_bf16.defined()) check_bf16_copy(qkv_bf16, qkv, op, "qkv_bf16");
  if (out_bf16.defined()) check_bf16_copy(out_bf16, out, op, "out_bf16");
  if constexpr (kCudaBackend) {
    if (!qkv.is_cpu())
      return cuda::qkv_attention(qkv, heads, kv_heads, theta, pos_offset, scale, out, lse, doc_start, qkv_bf16,
                                 out_bf16);
  }
  cpu::qkv_attention(qkv, heads, kv_heads, theta, pos_offset, scale, out, lse, doc_start, qkv_bf16, out_bf16);
}

void qkv_attention_backward(const Tensor& qkv, int64_t heads, int64_t kv_heads, double theta, int64_t pos_offset,
                            const Tensor& out, const Tensor& lse, const Tensor& dout, double scale, Tensor& dqkv,
                            const Tensor& doc_start) {
  const char* op = "qkv_attention_backward";
  // qkv and out as autograd kept them (check_kept_anywhere; alike on a CPU); dqkv, only a GEMM operand, may
  // be bf16 on a GPU.
  check_float(dout, op, "dout");
  check_kept_anywhere(qkv, dout, op, "qkv");
  check_kept_anywhere(out, dout, op, "out");
  if (qkv.is_cpu()) check_like(out, qkv, op, "out");
  check_like(lse, dout, op, "lse");
  check_qkv_attention_shapes(op, qkv, heads, kv_heads, theta, pos_offset, out, lse);
  check_doc_start(op, doc_start, qkv);
  check_shape(dout, out.shape(), op, "dout");
  check_kept(dqkv, dout, op, "dqkv");
  check_shape(dqkv, qkv.shape(), op, "dqkv");
  check_outputs_apart(op, {{&dqkv, "dqkv"}}, {{&qkv, "qkv"}, {&out, "out"}, {&lse, "lse"}, {&dout, "dout"}});
  if constexpr (kCudaBackend) {
    if (!qkv.is_cpu())
      return cuda::qkv_attention_backward(qkv, heads, kv_heads, theta, pos_offset, out, lse, dout, scale, dqkv,
                                          doc_start);
  }
  cpu::qkv_attention_backward(qkv, heads, kv_heads, theta, pos_offset, out, lse, dout, scale, dqkv, doc_start);
}

}  // namespace lt::kernels
