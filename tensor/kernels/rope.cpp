// The rotary position embedding front doors: RoPE on [B, T, H, D], and the split of a fused QKV
// projection with RoPE on q and k, forward and backward, and into a KV cache for decoding.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// The shapes of split_qkv_rope and its backward: qkv [B, T, (Hq + 2 Hkv) D], q [B, T, Hq, D],
// k and v [B, T, Hkv, D].
void check_qkv(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, double theta, int64_t pos_offset,
               const char* op) {
  check_float(qkv, op, "qkv");
  for (const Tensor* t : {&q, &k, &v}) check_like(*t, qkv, op, "q, k, v");
  LT_CHECK(q.ndim() == 4 && k.ndim() == 4, op, ": q and k must be [B, T, H, D], got ", q.str(), ", ", k.str());
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  check_shape(k, {B, T, Hkv, D}, op, "k");
  check_shape(v, {B, T, Hkv, D}, op, "v");
  check_shape(qkv, {B, T, (Hq + 2 * Hkv) * D}, op, "qkv");
  LT_CHECK(D % 2 == 0, op, ": head dim D must be even, got ", D);
  LT_CHECK(theta > 0 && pos_offset >= 0, op, ": theta must be positive and pos_offset >= 0");
}

}  // namespace

void rope(const Tensor& x, double theta, int64_t pos_offset, bool inverse, Tensor& y) {
  check_float(x, "rope", "x");
  check_like(y, x, "rope", "y");
  LT_CHECK(x.ndim() == 4, "rope: x must be [B, T, H, D], got ", x.str());
  check_shape(y, x.shape(), "rope", "y");
  LT_CHECK(x.dim(3) % 2 == 0, "rope: head dim D must be even, got ", x.str());
  LT_CHECK(theta > 0, "rope: theta must be positive, got ", theta);
  LT_CHECK(pos_offset >= 0, "rope: pos_offset must be >= 0, got ", pos_offset);
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::rope(x, theta, pos_offset, inverse, y);
  }
  cpu::rope(x, theta, pos_offset, inverse, y);
}

void split_qkv_rope(const Tensor& qkv, double theta, int64_t pos_offset, Tensor& q, Tensor& k, Tensor& v) {
  check_qkv(qkv, q, k, v, theta, pos_offset, "split_qkv_rope");
  if constexpr (kCudaBackend) {
    if (!qkv.is_cpu()) return cuda::split_qkv_rope(qkv, theta, pos_offset, q, k, v);
  }
  cpu::split_qkv_rope(qkv, theta, pos_offset, q, k, v);
}

void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, double theta, int64_t pos_offset,
                             Tensor& dqkv) {
  check_qkv(dqkv, dq, dk, dv, theta, pos_offset, "split_qkv_rope_backward");
  if constexpr (kCudaBackend) {
    if (!dqkv.is_cpu()) return cuda::split_qkv_rope_backward(dq, dk, dv, theta, pos_offset, dqkv);
  }
  cpu::split_qkv_rope_backward(dq, dk, dv, theta, pos_offset, dqkv);
}

void split_qkv_rope_to_cache(const Tensor& qkv, double theta, const std::vector<int64_t>& Tk_B, Tensor& q,
                             Tensor& k_cache, Tensor& v_cache) {
  const char* op = "split_qkv_rope_to_cache";
  check_float(qkv, op, "qkv");
  for (const Tensor* t : {&q, &k_cache, &v_cache}) check_like(*t, qkv, op, "q, k_cache, v_cache");
  LT_CHECK(q.ndim() == 4 && k_cache.ndim() == 4, op, ": q and k_cache must be [B, T, H, D], got ", q.str(), ", ",
           k_cache.str());
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), D = q.dim(3);
  const int64_t capacity = k_cache.dim(1), Hkv = k_cache.dim(2);
  check_shape(k_cache, {B, capacity, Hkv, D}, op, "k_cache");
  check_shape(v_cache, {B, capacity, Hkv, D}, op, "v_cache");
  check_shape(qkv, {B, T, (Hq + 2 * Hkv) * D}, op, "qkv");
  LT_CHECK(D % 2 == 0, op, ": head dim D must be even, got ", D);
  LT_CHECK(theta > 0, op, ": theta must be positive, got ", theta);
  LT_CHECK(static_cast<int64_t>(Tk_B.size()) == B, op, ": ", Tk_B.size(), " cached lengths for ", B, " rows");
  for (const int64_t Tk : Tk_B)
    LT_CHECK(Tk >= 0 && Tk + T <= capacity, op, ": ", T, " new positions after ", Tk,
             " cached ones exceed the capacity ", capacity);
  check_outputs_apart(op, {{&q, "q"}, {&k_cache, "k_cache"}, {&v_cache, "v_cache"}}, {{&qkv, "qkv"}});
  if constexpr (kCudaBackend) {
    if (!qkv.is_cpu()) return cuda::split_qkv_rope_to_cache(qkv, theta, Tk_B, q, k_cache, v_cache);
  }
  cpu::split_qkv_rope_to_cache(qkv, theta, Tk_B, q, k_cache, v_cache);
}

}  // namespace lt::kernels
