// The matrix-multiply front door: c = alpha * op(a) @ op(b) + beta * c, plain or batched, and
// c = op(a) @ op(b) + addend.
#include <atomic>

#include "tensor/cpu/amx.h"
#include "tensor/kernels/dispatch.h"

namespace lt::kernels {

namespace {
std::atomic<MatmulPrecision> precision_of_f32{MatmulPrecision::F32};
}  // namespace

void set_matmul_precision(MatmulPrecision precision) { precision_of_f32.store(precision); }
MatmulPrecision matmul_precision() { return precision_of_f32.load(); }
bool cpu_has_bf16_matmul() { return cpu::bf16_matmul_available(); }

ReusedMatmulOperands::ReusedMatmulOperands(std::vector<Tensor> constants)
    : operands_(cpu::begin_reused_operands(std::move(constants))) {}
ReusedMatmulOperands::~ReusedMatmulOperands() { cpu::end_reused_operands(operands_); }
const char* cpu_bf16_matmul_unit() {
  if (!cpu::bf16_matmul_available()) return nullptr;
  return cpu::amx_tiles() == cpu::AmxTiles::Hardware ? "AMX tiles" : "AVX512_BF16";
}

namespace {

// The shapes of c = op(a) @ op(b); false when there is nothing to compute (c empty).
bool check_matmul(const char* op, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c) {
  check_float(c, op, "c");
  check_kept_anywhere(a, c, op, "a");
  check_kept_anywhere(b, c, op, "b");
  LT_CHECK(a.ndim() == 2 || a.ndim() == 3, op, ": a must be 2-D or 3-D, got ", a.str());
  LT_CHECK(b.ndim() == 2 || b.ndim() == 3, op, ": b must be 2-D or 3-D, got ", b.str());
  const bool batched = a.ndim() == 3;
  const int64_t G = batched ? a.dim(0) : 1;
  LT_CHECK(b.ndim() == 2 || (batched && b.dim(0) == G), op, ": batch of b ", b.str(), " does not match a ", a.str());
  const int64_t M = trans_a ? a.dim(-1) : a.dim(-2);
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t Kb = trans_b ? b.dim(-1) : b.dim(-2);
  const int64_t N = trans_b ? b.dim(-2) : b.dim(-1);
  LT_CHECK(K == Kb, op, ": inner dimensions differ: ", a.str(), (trans_a ? "^T" : ""), " @ ", b.str(),
           (trans_b ? "^T" : ""));
  // Checked dimension by dimension: building the expected Shape would allocate on every call.
  const bool c_fits = c.ndim() == (batched ? 3 : 2) && (!batched || c.dim(0) == G) && c.dim(-2) == M && c.dim(-1) == N;
  if (!c_fits) check_shape(c, batched ? Shape{G, M, N} : Shape{M, N}, op, "c");
  return c.numel() > 0;
}

}  // namespace

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta) {
  if (!check_matmul("matmul", a, trans_a, b, trans_b, c)) return;
  if constexpr (kCudaBackend) {
    if (!a.is_cpu()) return cuda::matmul(a, trans_a, b, trans_b, c, alpha, beta, matmul_precision());
  }
  cpu::matmul(a, trans_a, b, trans_b, c, alpha, beta, matmul_precision());
}

void matmul_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& addend, Tensor& c) {
  const char* op = "matmul_add";
  const bool any = check_matmul(op, a, trans_a, b, trans_b, c);
  check_same(addend, c, op, "addend");
  check_outputs_apart(op, {{&c, "c"}}, {{&a, "a"}, {&b, "b"}, {&addend, "addend"}});
  if (!any) return;
  if constexpr (kCudaBackend) {
    // On a GPU, cuBLASLt's epilogue adds the f32 (f64) addend to the finished f32 (f64) sums: one rounding,
    // as the CPU's. Where it cannot be one call, the product and then the add.
    if (!a.is_cpu()) {
      if (cuda::matmul_add(a, trans_a, b, trans_b, addend, c, matmul_precision())) return;
      cuda::matmul(a, trans_a, b, trans_b, c, 1.0, 0.0, matmul_precision());
      return cuda::binary(BinaryOp::Add, addend, c, c, c.numel());
    }
  }
  cpu::matmul(a, trans_a, b, trans_b, c, 1.0, 0.0, matmul_precision(), addend);
}

}  // namespace lt::kernels
