// The front door of attention for generation with a KV cache.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& Tk_B, double scale,
                      Tensor& out) {
  check_float(q, "attention_decode", "q");
  check_like(k, q, "attention_decode", "k");
  check_like(v, q, "attention_decode", "v");
  check_like(out, q, "attention_decode", "out");
  LT_CHECK(q.ndim() == 4 && k.ndim() == 4 && k.shape() == v.shape(), "attention_decode: q ", q.str(), ", k ", k.str(),
           ", v ", v.str(), " must be [B, T, H, D]");
  const int64_t B = q.dim(0), Tq = q.dim(1), Hq = q.dim(2), D = q.dim(3);
  const int64_t capacity = k.dim(1), Hkv = k.dim(2);
  LT_CHECK(k.dim(0) == B && k.dim(3) == D && Hkv > 0 && Hq % Hkv == 0, "attention_decode: k ", k.str(),
           " does not fit q ", q.str());
  LT_CHECK(static_cast<int64_t>(Tk_B.size()) == B, "attention_decode: ", Tk_B.size(), " key lengths for ", B, " rows");
  for (const int64_t Tk : Tk_B)
    LT_CHECK(Tq <= Tk && Tk <= capacity, "attention_decode: need Tq <= Tk <= capacity, got ", Tq, ", ", Tk, ", ",
             capacity);
  check_shape(out, q.shape(), "attention_decode", "out");
  if constexpr (kCudaBackend) {
    if (!q.is_cpu()) return cuda::attention_decode(q, k, v, Tk_B, scale, out);
  }
  cpu::attention_decode(q, k, v, Tk_B, scale, out);
}

}  // namespace lt::kernels
