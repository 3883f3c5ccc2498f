// The hand-written CUDA kernels run on the CPU through tensor/cuda/emulation.h, on every machine: each
// kernel file is compiled here as plain C++ (its kernels and launchers in lt::cuda_emulated) and its
// results on odd sizes, partial blocks and grid-stride loops are compared with the CPU kernels'. A first
// group checks the emulation itself: the built-in variables, __shared__ memory, __syncthreads and warp
// shuffles behave as CUDA defines them. cuBLAS (gemm.cu) is not emulated: tests/cuda/test_cuda.cpp
// checks it where a GPU exists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "tensor/kernels.h"
#include "tests/test_util.h"

// clang-format off: the emulation must come before the kernel files it turns into C++.
#define LINGTRAIN_CUDA_EMULATION 1
#include "tensor/cuda/emulation.h"
#include "tensor/cuda/activation.cu"
#include "tensor/cuda/adamw.cu"
#include "tensor/cuda/elementwise.cu"
#include "tensor/cuda/norm.cu"
#include "tensor/cuda/softmax.cu"
// clang-format on

namespace lt {
namespace {

// ---- the emulation itself ----------------------------------------------------------------------

// Every thread writes its global index; with 2-D blocks, the x index varies fastest.
__global__ void write_indices(int64_t* out, int64_t n) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

TEST(CudaEmulation, EveryThreadOfEveryBlockRunsOnceWithItsOwnIndices) {
  std::vector<int64_t> out(101, -1);
  // 4 blocks of 8 x 4 threads = 128 threads for 101 elements: the last block is partial.
  LT_CUDA_LAUNCH(dim3(4), dim3(8, 4), write_indices)(out.data(), int64_t{101});
  for (int64_t i = 0; i < 101; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i);
}

// A block sum the way CUDA code writes it: a __shared__ tile, __syncthreads between the halving steps,
// then the last warp reduced with shuffles. Each block writes its partial sum.
constexpr int kReduceThreads = 128;
__global__ void block_sums(const float* x, float* partial, int64_t n) {
  __shared__ float tile[kReduceThreads];
  const int t = static_cast<int>(threadIdx.x);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + t;
  tile[t] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int half = kReduceThreads / 2; half >= 32; half /= 2) {
    if (t < half) tile[t] += tile[t + half];
    __syncthreads();
  }
  if (t < 32) {
    float v = tile[t];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, static_cast<unsigned>(offset));
    if (t == 0) partial[blockIdx.x] = v;
  }
}

TEST(CudaEmulation, SharedMemoryBarriersAndShufflesReduceABlock) {
  const int64_t n = 300;  // 3 blocks, the last one 44 elements long
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 17) - 8.0f;
  std::vector<float> partial(3, NAN);
  LT_CUDA_LAUNCH(dim3(3), dim3(kReduceThreads), block_sums)(x.data(), partial.data(), n);
  for (int b = 0; b < 3; ++b) {
    float expected = 0;
    for (int64_t i = b * kReduceThreads; i < std::min<int64_t>(n, (b + 1) * kReduceThreads); ++i)
      expected += x[static_cast<size_t>(i)];
    EXPECT_EQ(partial[static_cast<size_t>(b)], expected) << "block " << b;  // small integers: exact
  }
}

__global__ void butterfly(const double* x, double* out) {
  double v = x[threadIdx.x];
  for (unsigned mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  out[threadIdx.x] = v;
}

TEST(CudaEmulation, XorShufflesGiveEveryLaneTheWarpsSum) {
  std::vector<double> x(64), out(64);
  std::iota(x.begin(), x.end(), 1.0);
  LT_CUDA_LAUNCH(dim3(1), dim3(64), butterfly)(x.data(), out.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i < 32 ? 528.0 : 1552.0) << i;  // 1..32, 33..64
}

// ---- elementwise.cu ------------------------------------------------------------------------------

// Sizes around the block (256 threads) and grid-stride boundaries.
const std::vector<int64_t> kSizes = {1, 7, 255, 256, 257, 1000};

TEST(CudaEmulation, BinaryMatchesTheCpuKernel) {
  // [rows, cols] against b of the same shape or broadcast over the rows (b [cols]).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {1, 7}, {3, 85}, {1, 256}, {257, 1}, {8, 125}};
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [rows, cols] : shapes)
      for (bool broadcast : {false, true}) {
        const int64_t n = rows * cols, inner = broadcast ? cols : n;
        const Tensor a = test::random_tensor({rows, cols}, 1 + static_cast<uint64_t>(n), dtype);
        const Tensor b = broadcast ? test::random_tensor({cols}, 2 + static_cast<uint64_t>(n), dtype)
                                   : test::random_tensor({rows, cols}, 2 + static_cast<uint64_t>(n), dtype);
        for (kernels::BinaryOp op : {kernels::BinaryOp::Add, kernels::BinaryOp::Sub, kernels::BinaryOp::Mul}) {
          Tensor expected = Tensor::empty({rows, cols}, dtype), emulated = Tensor::empty({rows, cols}, dtype);
          switch (op) {
            case kernels::BinaryOp::Add: kernels::add(a, b, expected); break;
            case kernels::BinaryOp::Sub: kernels::sub(a, b, expected); break;
            case kernels::BinaryOp::Mul: kernels::mul(a, b, expected); break;
          }
          cuda_emulated::binary(op, a, b, emulated, inner);
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) +
                       (broadcast ? "] by a row" : "]"));
          // One rounding per element on both devices: bit for bit.
          EXPECT_EQ(std::memcmp(expected.raw_data(), emulated.raw_data(), expected.nbytes()), 0);
        }
      }
}

TEST(CudaEmulation, AxpbyMatchesTheCpuKernel) {
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t n : kSizes) {
      const Tensor x = test::random_tensor({n}, 3 + static_cast<uint64_t>(n), dtype);
      const Tensor y = test::random_tensor({n}, 4 + static_cast<uint64_t>(n), dtype);
      // axpy (beta 1: read y) and scale (beta 0: y only written).
      Tensor expected = y.clone(), emulated = y.clone();
      kernels::axpy(-0.75, x, expected);
      cuda_emulated::axpby(-0.75, x, 1.0, emulated);
      EXPECT_EQ(std::memcmp(expected.raw_data(), emulated.raw_data(), expected.nbytes()), 0) << "axpy, n " << n;
      Tensor scaled = Tensor::empty({n}, dtype), emulated_scaled = Tensor::full({n}, NAN, dtype);
      kernels::scale(x, 1.5, scaled);
      cuda_emulated::axpby(1.5, x, 0.0, emulated_scaled);  // NaN in y must not leak through beta 0
      EXPECT_EQ(std::memcmp(scaled.raw_data(), emulated_scaled.raw_data(), scaled.nbytes()), 0) << "scale, n " << n;
    }
}

TEST(CudaEmulation, FillMatchesTheCpuFill) {
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64})
    for (int64_t n : {int64_t{7}, int64_t{257}, int64_t{1000}})
      for (double value : {0.0, -0.0, 1.0 / 3.0}) {
        Tensor expected = Tensor::empty({n}, dtype), emulated = Tensor::full({n}, 5.0, dtype);
        expected.fill_(value);
        cuda_emulated::fill(emulated, value);
        EXPECT_EQ(std::memcmp(expected.raw_data(), emulated.raw_data(), expected.nbytes()), 0)
            << dtype_name(dtype) << " n " << n << " value " << value;
      }
}

// ---- activation.cu -------------------------------------------------------------------------------

TEST(CudaEmulation, ActivationsMatchTheCpuKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t n : kSizes) {
      const double tolerance = dtype == DType::F32 ? 1e-6 : 1e-14;  // the exponentials may differ in the last bit
      Tensor gate = Tensor::empty({n}, dtype);
      kernels::scale(test::random_tensor({n}, 5 + static_cast<uint64_t>(n), dtype), 6.0, gate);  // saturating too
      const Tensor up = test::random_tensor({n}, 6 + static_cast<uint64_t>(n), dtype);
      const Tensor dy = test::random_tensor({n}, 7 + static_cast<uint64_t>(n), dtype);
      auto fresh = [&]() { return Tensor::full({n}, NAN, dtype); };
      Tensor y = fresh(), y_emulated = fresh(), dx = fresh(), dx_emulated = fresh();
      Tensor glu = fresh(), glu_emulated = fresh(), dgate = fresh(), dgate_emulated = fresh();
      Tensor dup = fresh(), dup_emulated = fresh();
      kernels::silu(gate, y);
      cuda_emulated::silu(gate, y_emulated);
      kernels::silu_backward(gate, dy, dx);
      cuda_emulated::silu_backward(gate, dy, dx_emulated);
      kernels::swiglu(gate, up, glu);
      cuda_emulated::swiglu(gate, up, glu_emulated);
      kernels::swiglu_backward(gate, up, dy, dgate, dup);
      cuda_emulated::swiglu_backward(gate, up, dy, dgate_emulated, dup_emulated);
      const std::string where = std::string(dtype_name(dtype)) + " n " + std::to_string(n);
      auto values = [](const Tensor& t) { return t.to(DType::F64).to_vector<double>(); };
      test::expect_close(values(y_emulated), values(y), tolerance, tolerance, "silu " + where);
      test::expect_close(values(dx_emulated), values(dx), tolerance, tolerance, "silu dx " + where);
      test::expect_close(values(glu_emulated), values(glu), tolerance, tolerance, "swiglu " + where);
      test::expect_close(values(dgate_emulated), values(dgate), tolerance, tolerance,
                         "swiglu dgate " + where);
      test::expect_close(values(dup_emulated), values(dup), tolerance, tolerance,
                         "swiglu dup " + where);
    }
}

// ---- norm.cu -------------------------------------------------------------------------------------

// Rows shorter and longer than the 256-thread block, one row and many: the block's shared-memory sum
// and the column loop of dw. Sums run in another order than the CPU's, so values agree to rounding.
TEST(CudaEmulation, RmsNormMatchesTheCpuKernel) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape& shape : std::vector<Shape>{{1, 1}, {3, 7}, {2, 5, 300}, {9, 1000}}) {
      const double tolerance = dtype == DType::F32 ? 1e-5 : 1e-13;
      const int64_t C = shape.back();
      const Shape lead(shape.begin(), shape.end() - 1);
      const Tensor x = test::random_tensor(shape, 21, dtype), w = test::random_tensor({C}, 22, dtype);
      const Tensor dy = test::random_tensor(shape, 23, dtype), dw0 = test::random_tensor({C}, 24, dtype);
      Tensor y = Tensor::empty(shape, dtype), rstd = Tensor::empty(lead, dtype), dx = Tensor::empty(shape, dtype);
      Tensor y_e = Tensor::empty(shape, dtype), rstd_e = Tensor::empty(lead, dtype), dx_e = Tensor::empty(shape, dtype);
      Tensor dw = dw0.clone(), dw_e = dw0.clone();  // accumulated into
      kernels::rmsnorm(x, w, 1e-6, y, rstd);
      cuda_emulated::rmsnorm(x, w, 1e-6, y_e, rstd_e);
      kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw);
      cuda_emulated::rmsnorm_backward(x, w, rstd, dy, dx_e, dw_e);
      auto values = [](const Tensor& t) { return t.to(DType::F64).to_vector<double>(); };
      const std::string where = std::string(dtype_name(dtype)) + " " + Tensor::empty(shape).str();
      test::expect_close(values(y_e), values(y), tolerance, tolerance, "y " + where);
      test::expect_close(values(rstd_e), values(rstd), tolerance, tolerance, "rstd " + where);
      test::expect_close(values(dx_e), values(dx), tolerance, tolerance, "dx " + where);
      test::expect_close(values(dw_e), values(dw), tolerance, tolerance, "dw " + where);
    }
}

// ---- softmax.cu ----------------------------------------------------------------------------------

// Rows shorter and longer than the block, logits spread far beyond exp's f32 range (the max shift).
TEST(CudaEmulation, SoftmaxMatchesTheCpuKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape& shape : std::vector<Shape>{{1, 1}, {3, 7}, {2, 5, 300}, {4, 3000}}) {
      const double tolerance = dtype == DType::F32 ? 1e-5 : 1e-13;
      Tensor x = Tensor::empty(shape, dtype);
      kernels::scale(test::random_tensor(shape, 31, dtype), 30.0, x);
      const Tensor dy = test::random_tensor(shape, 32, dtype);
      auto values = [](const Tensor& t) { return t.to(DType::F64).to_vector<double>(); };
      const std::string where = std::string(dtype_name(dtype)) + " " + Tensor::empty(shape).str();
      Tensor p = Tensor::empty(shape, dtype), p_e = Tensor::empty(shape, dtype);
      Tensor logp = Tensor::empty(shape, dtype), logp_e = Tensor::empty(shape, dtype);
      kernels::softmax(x, p);
      cuda_emulated::softmax(x, p_e);
      kernels::log_softmax(x, logp);
      cuda_emulated::log_softmax(x, logp_e);
      test::expect_close(values(p_e), values(p), tolerance, tolerance, "softmax " + where);
      test::expect_close(values(logp_e), values(logp), tolerance, tolerance, "log_softmax " + where);
      // The backwards from the same (CPU) outputs, so only the backward kernels are compared.
      Tensor dx = Tensor::empty(shape, dtype), dx_e = Tensor::empty(shape, dtype);
      kernels::softmax_backward(p, dy, dx);
      cuda_emulated::softmax_backward(p, dy, dx_e);
      test::expect_close(values(dx_e), values(dx), tolerance, tolerance, "softmax dx " + where);
      kernels::log_softmax_backward(logp, dy, dx);
      cuda_emulated::log_softmax_backward(logp, dy, dx_e);
      test::expect_close(values(dx_e), values(dx), tolerance, tolerance, "log_softmax dx " + where);
    }
}

// ---- adamw.cu ------------------------------------------------------------------------------------

TEST(CudaEmulation, AdamWMatchesTheCpuKernel) {
  const kernels::AdamWStep step{3e-3, 0.9, 0.95, 1e-8, 0.1, 7, 0.5};  // t = 7, gradients clipped by half
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t n : kSizes) {
      const double tolerance = dtype == DType::F32 ? 1e-6 : 1e-14;
      const Tensor p0 = test::random_tensor({n}, 41, dtype), g = test::random_tensor({n}, 42, dtype);
      const Tensor m0 = test::random_tensor({n}, 43, dtype, 0.1);
      Tensor v0 = Tensor::empty({n}, dtype);
      kernels::mul(m0, m0, v0);  // a second moment is >= 0
      Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
      Tensor p_e = p0.clone(), m_e = m0.clone(), v_e = v0.clone();
      kernels::adamw_step(p, g, m, v, step);
      cuda_emulated::adamw_step(p_e, g, m_e, v_e, step);
      auto values = [](const Tensor& t) { return t.to(DType::F64).to_vector<double>(); };
      const std::string where = std::string(dtype_name(dtype)) + " n " + std::to_string(n);
      test::expect_close(values(p_e), values(p), tolerance, tolerance, "param " + where);
      test::expect_close(values(m_e), values(m), tolerance, tolerance, "m " + where);
      test::expect_close(values(v_e), values(v), tolerance, tolerance, "v " + where);
    }
}

}  // namespace
}  // namespace lt
