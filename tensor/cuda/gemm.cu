// Matrix multiply on the GPU through cuBLAS: c = alpha * op(a) @ op(b) + beta * c, plain or batched,
// in one strided-batched call. Host code only; nvcc compiles it with the CUDA backend.
#include "tensor/cuda/cuda_runtime.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::cuda {
namespace {

cublasStatus_t gemm_strided_batched(cublasHandle_t handle, cublasOperation_t op_first, cublasOperation_t op_second,
                                    int64_t m, int64_t n, int64_t k, float alpha, const float* first,
                                    int64_t ld_first, int64_t stride_first, const float* second, int64_t ld_second,
                                    int64_t stride_second, float beta, float* c, int64_t ldc, int64_t stride_c,
                                    int64_t batches) {
  return cublasSgemmStridedBatched_64(handle, op_first, op_second, m, n, k, &alpha, first, ld_first, stride_first,
                                      second, ld_second, stride_second, &beta, c, ldc, stride_c, batches);
}

cublasStatus_t gemm_strided_batched(cublasHandle_t handle, cublasOperation_t op_first, cublasOperation_t op_second,
                                    int64_t m, int64_t n, int64_t k, double alpha, const double* first,
                                    int64_t ld_first, int64_t stride_first, const double* second, int64_t ld_second,
                                    int64_t stride_second, double beta, double* c, int64_t ldc, int64_t stride_c,
                                    int64_t batches) {
  return cublasDgemmStridedBatched_64(handle, op_first, op_second, m, n, k, &alpha, first, ld_first, stride_first,
                                      second, ld_second, stride_second, &beta, c, ldc, stride_c, batches);
}

}  // namespace

void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision) {
  const bool batched = a.ndim() == 3;
  const bool b_shared = b.ndim() == 2;
  const int64_t G = batched ? a.dim(0) : 1;
  const int64_t M = trans_a ? a.dim(-1) : a.dim(-2);
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t N = trans_b ? b.dim(-2) : b.dim(-1);
  const int device = a.device().index;
  const DeviceGuard guard(device);

  // No products to sum: c = beta * c. cuBLAS is not asked, and beta == 0 writes zeros without reading
  // c, which may hold garbage (0 * NaN would be NaN).
  if (K == 0) {
    if (beta == 0.0) LT_CUDA_ZERO_ASYNC(c.raw_data(), c.nbytes());
    else axpby(beta, c, 0.0, c);
    return;
  }

  // As on the CPU: a stack of untransposed a against one shared b is a single tall [G*M, K] GEMM.
  const bool tall = batched && b_shared && !trans_a;
  const int64_t batches = tall ? 1 : G;
  const int64_t rows = tall ? G * M : M;

  // cuBLAS is column-major, and a row-major [R, C] matrix is the column-major [C, R] matrix, its
  // transpose. So the row-major c = op(a) op(b) is computed as the column-major c^T = op(b)^T op(a)^T:
  // b comes first, a second, and each keeps its own transpose flag. Leading dimensions are the stored
  // row lengths.
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t ld_b = trans_b ? K : N;
  const int64_t ld_a = trans_a ? M : K;
  const int64_t stride_b = b_shared ? 0 : K * N;  // stride 0: every batch reads the same b
  const cublasHandle_t handle = cublas_handle(device);
  device_count::blas_call(2 * static_cast<uint64_t>(G * M) * static_cast<uint64_t>(N * K));
  if (precision == MatmulPrecision::BF16Inputs && a.dtype() == DType::F32) {
    // Mixed precision: both operands rounded to bf16 (round to nearest even, as on the host; a weight
    // once per step), the products summed in f32 on the tensor cores into the f32 c.
    const Tensor a16 = bf16_operand(a), b16 = bf16_operand(b);
    const float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
    LT_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(handle, op_b, op_a, N, rows, K, &alpha32, b16.raw_data(), CUDA_R_16BF,
                                                  ld_b, stride_b, a16.raw_data(), CUDA_R_16BF, ld_a, M * K, &beta32,
                                                  c.raw_data(), CUDA_R_32F, N, M * N, batches, CUBLAS_COMPUTE_32F,
                                                  CUBLAS_GEMM_DEFAULT));
    return;
  }
  LT_FLOAT_SWITCH(a.dtype(), T,
                  LT_CUBLAS_CHECK(gemm_strided_batched(handle, op_b, op_a, N, rows, K, T(alpha), b.data<T>(), ld_b,
                                                       stride_b, a.data<T>(), ld_a, M * K, T(beta), c.data<T>(), N,
                                                       M * N, batches)));
}

}  // namespace lt::cuda

// The grouped GEMMs, one matmul per expert segment. The segment bounds come from the front door's host
// copy of the offsets (read once per call, not once per expert), since cuBLAS takes its sizes on the host.
#include "tensor/cuda/grouped_matmul.h"  // IWYU pragma: keep
