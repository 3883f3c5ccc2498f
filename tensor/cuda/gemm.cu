// Matrix multiply on the GPU through cuBLAS: c = alpha * op(a) @ op(b) + beta * c, plain or batched,
// in one strided-batched call; c = op(a) @ op(b) + addend through cuBLASLt, whose epilogue reads the addend
// as it writes c; and the experts' grouped GEMMs, one grouped-batched call each (with the small kernel of
// grouped_matmul.h that writes their addresses). nvcc compiles it with the CUDA backend.
#include <utility>
#include <vector>

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
  if (precision == MatmulPrecision::BF16Inputs && c.dtype() == DType::F32) {
    // Mixed precision: both operands rounded to bf16 (round to nearest even, as on the host; a weight
    // once per step, an activation kept in bf16 for the backward not again), the products summed in f32
    // on the tensor cores into the f32 c.
    const Tensor a16 = bf16_operand(a), b16 = bf16_operand(b);
    const float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
    LT_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(handle, op_b, op_a, N, rows, K, &alpha32, b16.raw_data(), CUDA_R_16BF,
                                                  ld_b, stride_b, a16.raw_data(), CUDA_R_16BF, ld_a, M * K, &beta32,
                                                  c.raw_data(), CUDA_R_32F, N, M * N, batches, CUBLAS_COMPUTE_32F,
                                                  CUBLAS_GEMM_DEFAULT));
    return;
  }
  if (precision == MatmulPrecision::TF32 && a.dtype() == DType::F32) {
    // The f32 operands enter the tensor cores as TF32 (cuBLAS rounds them), the products summed in f32.
    const float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
    LT_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(handle, op_b, op_a, N, rows, K, &alpha32, b.raw_data(), CUDA_R_32F,
                                                  ld_b, stride_b, a.raw_data(), CUDA_R_32F, ld_a, M * K, &beta32,
                                                  c.raw_data(), CUDA_R_32F, N, M * N, batches,
                                                  CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    return;
  }
  LT_FLOAT_SWITCH(a.dtype(), T,
                  LT_CUBLAS_CHECK(gemm_strided_batched(handle, op_b, op_a, N, rows, K, T(alpha), b.data<T>(), ld_b,
                                                       stride_b, a.data<T>(), ld_a, M * K, T(beta), c.data<T>(), N,
                                                       M * N, batches)));
}

namespace {

// The descriptors of one cuBLASLt call, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtCall() = default;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  ~LtCall() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
    for (cublasLtMatrixLayout_t layout : {first, second, out})
      if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// A row-major [rows, cols] matrix as cuBLASLt's column-major layout: [cols, rows], leading dimension cols.
cublasLtMatrixLayout_t row_major_layout(cudaDataType_t type, int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t layout = nullptr;
  LT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows),
                                             cols));
  return layout;
}

// The largest power of two, up to 256 bytes, that divides the address of t's first element: cuBLASLt's
// heuristic assumes 256-byte aligned operands unless told otherwise, and a view may start anywhere.
uint32_t alignment_of(const Tensor& t) {
  const auto address = reinterpret_cast<uintptr_t>(t.raw_data());
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace

bool matmul_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& addend, Tensor& c,
                MatmulPrecision precision) {
  // One product: a 2-D a, or a stack of untransposed a against one shared b (a single tall GEMM, as in
  // matmul). Other batched products go apart.
  const bool tall = a.ndim() == 2 || (b.ndim() == 2 && !trans_a);
  if (!tall) return false;
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  const int64_t N = trans_b ? b.dim(-2) : b.dim(-1);
  const int64_t rows = c.numel() / N;
  if (K == 0 || rows == 0) return false;
  const int device = a.device().index;
  const DeviceGuard guard(device);
  const bool f64 = c.dtype() == DType::F64;
  const bool bf16 = precision == MatmulPrecision::BF16Inputs && !f64;
  const cudaDataType_t out_type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cudaDataType_t operand_type = bf16 ? CUDA_R_16BF : out_type;
  const cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F
                                      : precision == MatmulPrecision::TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                             : CUBLAS_COMPUTE_32F;
  // Column-major, as matmul: c^T = op(b)^T op(a)^T, b first. Each operand's stored matrix, row-major.
  const Tensor first = bf16 ? bf16_operand(b) : b, second = bf16 ? bf16_operand(a) : a;
  LtCall call;
  LT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&call.op, compute, f64 ? CUDA_R_64F : CUDA_R_32F));
  const cublasOperation_t op_first = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
  call.first = row_major_layout(operand_type, b.dim(-2), b.dim(-1));
  call.second = row_major_layout(operand_type, a.numel() / a.dim(-1), a.dim(-1));
  call.out = row_major_layout(out_type, rows, N);  // the addend's and c's
  const LtDevice lt = cublaslt_device(device);
  LT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&call.preference));
  const size_t workspace_bytes = kLtWorkspaceBytes;
  LT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes, sizeof workspace_bytes));
  const std::pair<cublasLtMatmulPreferenceAttributes_t, const Tensor*> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &first},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &second},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &addend},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c}};
  for (const auto& [attribute, operand] : alignments) {
    const uint32_t alignment = alignment_of(*operand);
    LT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(call.preference, attribute, &alignment, sizeof alignment));
  }
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(lt.handle, call.op, call.first, call.second, call.out,
                                                               call.out, call.preference, 1, &heuristic, &found);
  if (asked != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  device_count::blas_call(2 * static_cast<uint64_t>(rows) * static_cast<uint64_t>(N * K));
  const double one64 = 1.0;
  const float one32 = 1.0f;
  const void* one = f64 ? static_cast<const void*>(&one64) : static_cast<const void*>(&one32);
  LT_CUBLAS_CHECK(cublasLtMatmul(lt.handle, call.op, one, first.raw_data(), call.first, second.raw_data(), call.second,
                                 one, addend.raw_data(), call.out, c.raw_data(), call.out, &heuristic.algo,
                                 lt.workspace, kLtWorkspaceBytes, nullptr));
  return true;
}

bool grouped_gemm(const GroupedGemm& g, MatmulPrecision precision) {
  if (g.parts.front().a.dtype() == DType::BF16) {
    if (!grouped_gemm_bf16_takes(g)) return false;
    grouped_gemm_bf16(g);
    return true;
  }
  // Column-major, as matmul above: problem j's c_j^T = op(b_j)^T op(a_j)^T, so b comes first and a
  // second, each with its own transpose flag and its stored row length as leading dimension. One group per
  // problem: the experts' row counts differ.
  const auto problems = static_cast<int64_t>(g.m.size());
  std::vector<cublasOperation_t> op_a, op_b;
  std::vector<int64_t> ld_a, ld_b, ld_c;
  std::vector<double> beta;
  for (int64_t j = 0; j < problems; ++j) {
    const GroupedGemm::Part& part = g.part_of(j);
    op_a.push_back(part.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    op_b.push_back(part.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    ld_a.push_back(part.a.dim(-1));
    ld_b.push_back(part.b.dim(-1));
    ld_c.push_back(part.c.dim(-1));
    beta.push_back(part.beta);
  }
  const std::vector<int64_t> group_size(problems, 1);
  const int64_t* pointers = g.pointers.data<int64_t>();
  const int64_t stride = g.pointers.dim(1);
  const auto a_j = reinterpret_cast<const void* const*>(pointers);
  const auto b_j = reinterpret_cast<const void* const*>(pointers + stride);
  const auto c_j = reinterpret_cast<void* const*>(pointers + 2 * stride);
  const GroupedGemm::Part& first = g.parts.front();
  const cublasHandle_t handle = cublas_handle(first.c.device().index);
  if (first.a.dtype() == DType::F64) {
    const std::vector<double> alpha(problems, 1.0);
    LT_CUBLAS_CHECK(cublasDgemmGroupedBatched_64(
        handle, op_b.data(), op_a.data(), g.n.data(), g.m.data(), g.k.data(), alpha.data(),
        reinterpret_cast<const double* const*>(b_j), ld_b.data(), reinterpret_cast<const double* const*>(a_j),
        ld_a.data(), beta.data(), reinterpret_cast<double* const*>(c_j), ld_c.data(), problems, group_size.data()));
    device_count::blas_call(g.flops());
    return true;
  }
  const std::vector<float> alpha32(problems, 1.0f), beta32(beta.begin(), beta.end());
  // TF32 on the tensor cores only where every matrix is aligned for them; otherwise exact f32.
  const cublasComputeType_t compute =
      precision == MatmulPrecision::TF32 && g.aligned16 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LT_CUBLAS_CHECK(cublasGemmGroupedBatchedEx_64(
      handle, op_b.data(), op_a.data(), g.n.data(), g.m.data(), g.k.data(), alpha32.data(), b_j, CUDA_R_32F,
      ld_b.data(), a_j, CUDA_R_32F, ld_a.data(), beta32.data(), c_j, CUDA_R_32F, ld_c.data(), problems,
      group_size.data(), compute));
  device_count::blas_call(g.flops());
  return true;
}

}  // namespace lt::cuda

// The grouped GEMMs over the experts, each one grouped_gemm above.
#include "tensor/cuda/grouped_matmul.h"  // IWYU pragma: keep
