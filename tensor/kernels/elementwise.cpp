// The elementwise front doors: add, sub, mul with broadcasting, scale, axpy, sum_to.
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

// The size of the trailing part of a's shape that b's shape equals (b broadcasts over the rest).
int64_t broadcast_inner(const Tensor& a, const Tensor& b, const char* op) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  bool suffix = sb.size() <= sa.size();
  for (size_t i = 0; suffix && i < sb.size(); ++i) suffix = sb[sb.size() - 1 - i] == sa[sa.size() - 1 - i];
  LT_CHECK(suffix, op, ": cannot broadcast ", shape_str(sb), " over ", shape_str(sa));
  return b.numel();
}

void binary(BinaryOp op, const char* name, const Tensor& a, const Tensor& b, Tensor& out) {
  check_float(a, name, "a");
  check_like(b, a, name, "b");
  check_same(out, a, name, "out");
  const int64_t inner = broadcast_inner(a, b, name);
  if (a.numel() == 0) return;
  if constexpr (kCudaBackend) {
    if (!a.is_cpu()) return cuda::binary(op, a, b, out, inner);
  }
  cpu::binary(op, a, b, out, inner);
}

// y = alpha * x + beta * y, the kernel behind scale (beta 0: y is only written) and axpy (beta 1).
void axpby(const char* name, const char* y_name, double alpha, const Tensor& x, double beta, Tensor& y) {
  check_float(x, name, "x");
  check_same(y, x, name, y_name);
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::axpby(alpha, x, beta, y);
  }
  cpu::axpby(alpha, x, beta, y);
}

// axpby with alpha = factor * s[0].
void axpby_by(const char* name, const char* y_name, const Tensor& s, double factor, const Tensor& x, double beta,
              Tensor& y) {
  check_float(x, name, "x");
  check_same(y, x, name, y_name);
  check_like(s, x, name, "s");
  LT_CHECK(s.numel() == 1, name, ": s must hold one element, got ", s.str());
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::axpby_by(s, factor, x, beta, y);
  }
  cpu::axpby_by(s, factor, x, beta, y);
}

}  // namespace

void scale_by(const Tensor& x, const Tensor& s, double alpha, Tensor& out) {
  axpby_by("scale_by", "out", s, alpha, x, 0.0, out);
}
void axpy_by(const Tensor& s, double alpha, const Tensor& x, Tensor& y) {
  axpby_by("axpy_by", "y", s, alpha, x, 1.0, y);
}

void add(const Tensor& a, const Tensor& b, Tensor& out) { binary(BinaryOp::Add, "add", a, b, out); }
void sub(const Tensor& a, const Tensor& b, Tensor& out) { binary(BinaryOp::Sub, "sub", a, b, out); }
void mul(const Tensor& a, const Tensor& b, Tensor& out) { binary(BinaryOp::Mul, "mul", a, b, out); }

void scale(const Tensor& x, double alpha, Tensor& out) { axpby("scale", "out", alpha, x, 0.0, out); }
void axpy(double alpha, const Tensor& x, Tensor& y) { axpby("axpy", "y", alpha, x, 1.0, y); }

void sum_to(const Tensor& x, Tensor& out) {
  check_float(x, "sum_to", "x");
  check_like(out, x, "sum_to", "out");
  broadcast_inner(x, out, "sum_to");
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::sum_to(x, out);
  }
  cpu::sum_to(x, out);
}

void convert(const Tensor& x, Tensor& y) {
  LT_CHECK((x.dtype() == DType::F32 && y.dtype() == DType::BF16) || (x.dtype() == DType::BF16 && y.dtype() == DType::F32),
           "convert: from ", x.str(), " to ", y.str(), " (f32 <-> bf16 only)");
  LT_CHECK(x.shape() == y.shape() && x.device() == y.device(), "convert: ", y.str(), " cannot hold ", x.str());
  if (x.numel() == 0) return;
  if constexpr (kCudaBackend) {
    if (!x.is_cpu()) return cuda::convert(x, y);
  }
  cpu::convert(x, y);
}

}  // namespace lt::kernels
