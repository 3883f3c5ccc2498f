// Matrix multiply: c = alpha * op(a) @ op(b) + beta * c, with every transpose variant the forward and
// backward passes need, batched or not.
//
// The operands are first packed so the inner loop reads both contiguously: op(b) into a [K, N] panel
// and, when a is transposed, op(a) into [M, K]. The micro-kernel keeps a 4-row x 2-vector tile of c in
// registers and streams k, so each loaded b vector feeds 4 FMAs. Rows of c are split across threads;
// every element is summed over k in order, so results do not depend on the thread count.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/gemm.cc"
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernel_util.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Packing buffers grow to the largest size seen and are reused, so steady-state steps allocate nothing.
template <class T>
T* scratch(std::vector<T>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// dst [rows, cols] = src^T where src is [cols, rows] with leading dimension ld.
template <class T>
void Transpose(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst) {
  parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[c * ld + r];
  });
}

// c rows [r0, r0 + kRows), columns [j, j + 2 vectors), over all k.
template <int kRows, class D, class T = hn::TFromD<D>>
HWY_INLINE void Tile(D d, const T* a, int64_t K, const T* b, int64_t N, T* c, int64_t j, T alpha, T beta) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<D>;
  V acc0[kRows], acc1[kRows];
  for (int r = 0; r < kRows; ++r) acc0[r] = acc1[r] = hn::Zero(d);
  for (int64_t k = 0; k < K; ++k) {
    const V b0 = hn::LoadU(d, b + k * N + j);
    const V b1 = hn::LoadU(d, b + k * N + j + lanes);
    for (int r = 0; r < kRows; ++r) {
      const V ar = hn::Set(d, a[r * K + k]);
      acc0[r] = hn::MulAdd(ar, b0, acc0[r]);
      acc1[r] = hn::MulAdd(ar, b1, acc1[r]);
    }
  }
  const V va = hn::Set(d, alpha), vb = hn::Set(d, beta);
  for (int r = 0; r < kRows; ++r) {
    T* cr = c + r * N + j;
    if (beta == T(0)) {
      hn::StoreU(hn::Mul(va, acc0[r]), d, cr);
      hn::StoreU(hn::Mul(va, acc1[r]), d, cr + lanes);
    } else {
      hn::StoreU(hn::MulAdd(va, acc0[r], hn::Mul(vb, hn::LoadU(d, cr))), d, cr);
      hn::StoreU(hn::MulAdd(va, acc1[r], hn::Mul(vb, hn::LoadU(d, cr + lanes))), d, cr + lanes);
    }
  }
}

// Columns past the last full 2-vector tile, one element at a time.
template <class T>
void TailColumns(const T* a, int64_t rows, int64_t K, const T* b, int64_t N, T* c, int64_t j0, T alpha, T beta) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = j0; j < N; ++j) {
      T acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += a[r * K + k] * b[k * N + j];
      c[r * N + j] = beta == T(0) ? alpha * acc : alpha * acc + beta * c[r * N + j];
    }
}

// c [M, N] = alpha * a [M, K] @ b [K, N] + beta * c, all contiguous.
template <class T>
void GemmPacked(const T* a, const T* b, T* c, int64_t M, int64_t N, int64_t K, T alpha, T beta) {
  const hn::ScalableTag<T> d;
  const int64_t tile_cols = 2 * static_cast<int64_t>(hn::Lanes(d));
  const int64_t full_cols = N / tile_cols * tile_cols;
  const int64_t row_blocks = (M + 3) / 4;
  parallel_for(row_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t r0 = block * 4;
      const int64_t rows = std::min<int64_t>(4, M - r0);
      const T* ar = a + r0 * K;
      T* cr = c + r0 * N;
      for (int64_t j = 0; j < full_cols; j += tile_cols) {
        switch (rows) {
          case 4: Tile<4>(d, ar, K, b, N, cr, j, alpha, beta); break;
          case 3: Tile<3>(d, ar, K, b, N, cr, j, alpha, beta); break;
          case 2: Tile<2>(d, ar, K, b, N, cr, j, alpha, beta); break;
          default: Tile<1>(d, ar, K, b, N, cr, j, alpha, beta); break;
        }
      }
      TailColumns(ar, rows, K, b, N, cr, full_cols, alpha, beta);
    }
  });
}

template <class T>
void GemmT(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* a, const T* b, T beta,
           T* c) {
  static thread_local std::vector<T> a_pack, b_pack;
  if (trans_a) {
    T* packed = scratch(a_pack, M * K);
    Transpose(a, M, M, K, packed);  // a is [K, M]
    a = packed;
  }
  if (trans_b) {
    T* packed = scratch(b_pack, K * N);
    Transpose(b, K, K, N, packed);  // b is [N, K]
    b = packed;
  }
  GemmPacked(a, b, c, M, N, K, alpha, beta);
}

void GemmKernel(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                const void* a, const void* b, double beta, void* c) {
  LT_FLOAT_SWITCH(dtype, T,
                  GemmT<T>(trans_a, trans_b, M, N, K, T(alpha), static_cast<const T*>(a), static_cast<const T*>(b),
                           T(beta), static_cast<T*>(c)));
}

}  // namespace lt::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::kernels {
HWY_EXPORT(GemmKernel);

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta) {
  check_float(a, "matmul", "a");
  check_like(b, a, "matmul", "b");
  check_like(c, a, "matmul", "c");
  LT_CHECK(a.ndim() == 2 || a.ndim() == 3, "matmul: a must be 2-D or 3-D, got ", a.str());
  LT_CHECK(b.ndim() == 2 || b.ndim() == 3, "matmul: b must be 2-D or 3-D, got ", b.str());
  const bool batched = a.ndim() == 3;
  const int64_t G = batched ? a.dim(0) : 1;
  LT_CHECK(b.ndim() == 2 || (batched && b.dim(0) == G), "matmul: batch of b ", b.str(), " does not match a ",
           a.str());
  const int64_t M = trans_a ? a.dim(-1) : a.dim(-2);
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t Kb = trans_b ? b.dim(-1) : b.dim(-2);
  const int64_t N = trans_b ? b.dim(-2) : b.dim(-1);
  LT_CHECK(K == Kb, "matmul: inner dimensions differ: ", a.str(), (trans_a ? "^T" : ""), " @ ", b.str(),
           (trans_b ? "^T" : ""));
  check_shape(c, batched ? Shape{G, M, N} : Shape{M, N}, "matmul", "c");
  if (c.numel() == 0) return;
#ifdef LINGTRAIN_CUDA
  if (!a.is_cpu()) return cuda::matmul(a, trans_a, b, trans_b, c, alpha, beta);
#endif
  const auto gemm = HWY_DYNAMIC_DISPATCH(GemmKernel);
  const size_t elem = dtype_size(a.dtype());
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  char* pc = static_cast<char*>(c.raw_data());
  if (batched && b.ndim() == 2 && !trans_a) {  // one tall GEMM: [G*M, K] @ op(b)
    gemm(a.dtype(), false, trans_b, G * M, N, K, alpha, pa, pb, beta, pc);
    return;
  }
  const bool b_batched = b.ndim() == 3;
  for (int64_t g = 0; g < G; ++g)
    gemm(a.dtype(), trans_a, trans_b, M, N, K, alpha, pa + g * M * K * elem, pb + (b_batched ? g * K * N * elem : 0),
         beta, pc + g * M * N * elem);
}

}  // namespace lt::kernels
#endif  // HWY_ONCE
