// The hand-written CUDA kernels run on the CPU through tensor/cuda/emulation.h, on every machine: each
// kernel file is compiled here as plain C++ (its kernels and launchers in lt::cuda_emulated) and its
// results on odd sizes, partial blocks and grid-stride loops are compared with the CPU kernels'. A first
// group checks the emulation itself: the built-in variables, __shared__ memory, __syncthreads and warp
// shuffles behave as CUDA defines them. cuBLAS (gemm.cu) is not emulated: tests/cuda/test_cuda.cpp
// checks it where a GPU exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "tensor/kernels.h"
#include "tests/test_util.h"

// The emulation must come before the kernel files it turns into C++ (not sorted).
// clang-format off
#define LINGTRAIN_CUDA_EMULATION 1
#include "tensor/cuda/emulation.h"
#include "tensor/cuda/activation.cu"
#include "tensor/cuda/adamw.cu"
#include "tensor/cuda/attention.cu"
#include "tensor/cuda/attention_decode.cu"
#include "tensor/cuda/dpo.cu"
#include "tensor/cuda/elementwise.cu"
#include "tensor/cuda/index.cu"
#include "tensor/cuda/moe.cu"
#include "tensor/cuda/moe_stats.cu"
#include "tensor/cuda/norm.cu"
#include "tensor/cuda/normhead.cu"
#include "tensor/cuda/reduce.cu"
#include "tensor/cuda/rope.cu"
#include "tensor/cuda/slice.cu"
#include "tensor/cuda/softmax.cu"
// clang-format on

namespace lt {
namespace {

std::vector<double> values(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }

// The same bytes: what a kernel with the CPU kernel's arithmetic in the same order must give.
void expect_same_bits(const Tensor& emulated, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(emulated.nbytes(), expected.nbytes()) << what;
  EXPECT_EQ(std::memcmp(emulated.raw_data(), expected.raw_data(), expected.nbytes()), 0) << what;
}

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

// Each thread publishes its index in __shared__ memory and reads its neighbour's, the one above it (+1)
// or below it (-1, wrapping around), with or without the barrier between that CUDA requires. The
// emulated threads take turns from first to last up to a launch's first barrier and from last to first
// after it, so without the barrier every thread but one reads a stale value in either direction:
// reading above before the first barrier, below after it.
__global__ void read_neighbour(int* out, int offset, bool barrier_between, bool after_a_barrier) {
  __shared__ int published[64];
  const int t = static_cast<int>(threadIdx.x);
  if (after_a_barrier) __syncthreads();
  published[t] = t;
  if (barrier_between) __syncthreads();
  out[t] = published[(t + offset + 64) % 64];
  __syncthreads();
  published[t] = -1;  // what the next launch finds before its threads publish
}

TEST(CudaEmulation, AMissingBarrierShowsAsStaleValuesInEitherDirection) {
  for (int offset : {1, -1}) {
    const bool after_a_barrier = offset == -1;
    std::vector<int> out(64, 0);
    LT_CUDA_LAUNCH(dim3(1), dim3(64), read_neighbour)(out.data(), offset, true, after_a_barrier);
    for (int t = 0; t < 64; ++t) EXPECT_EQ(out[static_cast<size_t>(t)], (t + offset + 64) % 64) << offset;
    LT_CUDA_LAUNCH(dim3(1), dim3(64), read_neighbour)(out.data(), offset, false, after_a_barrier);
    EXPECT_EQ(std::count(out.begin(), out.end(), -1), 63) << "offset " << offset;
  }
}

// Threads that do not all reach a __syncthreads (undefined in CUDA; a GPU usually hangs) end the
// emulated launch with an error instead of hanging the test, and the next launch runs normally.
__global__ void only_even_threads_wait() {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
    __syncthreads();
  }
}

TEST(CudaEmulation, ABarrierSomeThreadsNeverReachIsAnError) {
  EXPECT_THROW(LT_CUDA_LAUNCH(dim3(1), dim3(64), only_even_threads_wait)(), Error);
  std::vector<int64_t> out(8, -1);
  LT_CUDA_LAUNCH(dim3(1), dim3(8), write_indices)(out.data(), int64_t{8});
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i);
}

// The warp matrix functions: a row-major a (row stride 24) times a column-major b (stride 20), added
// twice onto ones, stored column-major. Small integers keep every product and sum exact, so the result
// is the one any order of the f32 sums gives.
__global__ void warp_products(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a_fragment;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b_fragment;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> sum;
  wmma::fill_fragment(sum, 1.0f);
  wmma::load_matrix_sync(a_fragment, a, 24);
  wmma::load_matrix_sync(b_fragment, b, 20);
  wmma::mma_sync(sum, a_fragment, b_fragment, sum);
  wmma::mma_sync(sum, a_fragment, b_fragment, sum);
  wmma::store_matrix_sync(c, sum, 16, wmma::mem_col_major);
}

TEST(CudaEmulation, WarpMatrixFunctionsMultiplyBf16TilesInTheirLayouts) {
  auto small = [](int i, int j) { return static_cast<float>((i * 7 + j * 3) % 9 - 4); };
  std::vector<uint16_t> a(16 * 24), b(16 * 20);
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 16; ++k) a[static_cast<size_t>(r * 24 + k)] = f32_to_bf16(small(r, k));
  for (int k = 0; k < 16; ++k)
    for (int n = 0; n < 16; ++n) b[static_cast<size_t>(n * 20 + k)] = f32_to_bf16(small(n + 5, k));
  std::vector<float> c(16 * 16, NAN);
  LT_CUDA_LAUNCH(dim3(1), dim3(32), warp_products)(reinterpret_cast<const __nv_bfloat16*>(a.data()),
                                                    reinterpret_cast<const __nv_bfloat16*>(b.data()), c.data());
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float dot = 0;
      for (int k = 0; k < 16; ++k) dot += small(r, k) * small(n + 5, k);
      EXPECT_EQ(c[static_cast<size_t>(n * 16 + r)], 1.0f + 2.0f * dot) << "row " << r << " column " << n;
    }
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
            case kernels::BinaryOp::Add:
              kernels::add(a, b, expected);
              break;
            case kernels::BinaryOp::Sub:
              kernels::sub(a, b, expected);
              break;
            case kernels::BinaryOp::Mul:
              kernels::mul(a, b, expected);
              break;
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

// Mixed precision's operand rounding: nearest even, NaN kept NaN, as the host's conversion.
TEST(CudaEmulation, RoundToBf16MatchesTheHostConversion) {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.01171875f, -3.3e38f, 3.4e38f, 1e-40f, INFINITY,
                               -INFINITY, NAN, 65504.0f, 1.0f / 3.0f};
  for (int i = 0; i < 300; ++i) values.push_back(static_cast<float>(std::sin(i * 0.37) * std::pow(10.0, i % 9 - 4)));
  const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(values.size())}, values);
  Tensor y = Tensor::empty(x.shape(), DType::BF16);
  cuda_emulated::round_to_bf16(x, y);
  expect_same_bits(y, x.to(DType::BF16), "bf16 of " + std::to_string(values.size()) + " values");
}

// The widening back (mixed precision's saved activations): every bf16 bit pattern, exactly.
TEST(CudaEmulation, WidenBf16IsExactForEveryBitPattern) {
  Tensor x = Tensor::empty({65536}, DType::BF16);
  for (uint32_t bits = 0; bits < 65536; ++bits) x.bf16_data()[bits] = static_cast<uint16_t>(bits);
  Tensor y = Tensor::empty({65536}), expected = Tensor::empty({65536});
  cuda_emulated::widen_bf16(x, y);
  // bf16 is the top half of an f32: the pattern shifted up 16 bits, NaN payloads included.
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint32_t wide = bits << 16;
    std::memcpy(expected.data<float>() + bits, &wide, sizeof wide);
  }
  expect_same_bits(y, expected, "every bf16 widened");
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
      Tensor glu = fresh(), glu_emulated = fresh();
      kernels::silu(gate, y);
      cuda_emulated::silu(gate, y_emulated);
      kernels::silu_backward(gate, dy, dx);
      cuda_emulated::silu_backward(gate, dy, dx_emulated);
      // Three rows of a fused gate_up (n columns each): the kernel's row / column split at every width.
      const Tensor gate_up = test::side_by_side(gate.reshape({1, n}), up.reshape({1, n})).reshape({2 * n});
      const Tensor rows3 = test::side_by_side(test::random_tensor({3, n}, 8, dtype, 4.0),
                                              test::random_tensor({3, n}, 9, dtype));
      Tensor dgate_up = Tensor::full({2 * n}, NAN, dtype), dgate_up_emulated = Tensor::full({2 * n}, NAN, dtype);
      Tensor glu3 = Tensor::full({3, n}, NAN, dtype), glu3_emulated = Tensor::full({3, n}, NAN, dtype);
      kernels::swiglu(gate_up, glu);
      cuda_emulated::swiglu(gate_up, glu_emulated);
      kernels::swiglu(rows3, glu3);
      cuda_emulated::swiglu(rows3, glu3_emulated);
      kernels::swiglu_backward(gate_up, dy, dgate_up);
      cuda_emulated::swiglu_backward(gate_up, dy, dgate_up_emulated);
      const std::string where = std::string(dtype_name(dtype)) + " n " + std::to_string(n);
      test::expect_close(values(y_emulated), values(y), tolerance, tolerance, "silu " + where);
      test::expect_close(values(dx_emulated), values(dx), tolerance, tolerance, "silu dx " + where);
      test::expect_close(values(glu_emulated), values(glu), tolerance, tolerance, "swiglu " + where);
      test::expect_close(values(glu3_emulated), values(glu3), tolerance, tolerance, "swiglu 3 rows " + where);
      test::expect_close(values(dgate_up_emulated), values(dgate_up), tolerance, tolerance,
                         "swiglu dgate_up " + where);
    }
}

// Under mixed precision the SwiGLU writes the bf16 copies autograd keeps of its input and output (the
// host's rounding) beside its output, and the backward kernels read gate_up as kept, widening each element
// as they read it: the same bits as the kernels on the widened f32 tensors; their outputs that only GEMMs
// read, written in bf16, are the roundings of the f32 results.
TEST(CudaEmulation, SwigluWritesAndItsBackwardsReadKeptBf16Copies) {
  const int64_t N = 5, k = 2, C = 300, M = N * k;
  Tensor gate = Tensor::empty({M, C}, DType::F32);
  kernels::scale(test::random_tensor({M, C}, 71, DType::F32), 6.0, gate);
  const Tensor gate_up = test::side_by_side(gate, test::random_tensor({M, C}, 72, DType::F32));
  const Tensor dy = test::random_tensor({M, C}, 73, DType::F32);
  const Tensor gate_up16 = gate_up.to(DType::BF16);
  Tensor y = Tensor::empty({M, C}, DType::F32), y_keeping = Tensor::empty({M, C}, DType::F32);
  Tensor gate_up_kept = Tensor::empty({M, 2 * C}, DType::BF16);
  Tensor y_kept = Tensor::empty({M, C}, DType::BF16), y_operand = Tensor::empty({M, C}, DType::BF16);
  cuda_emulated::swiglu(gate_up, y);
  cuda_emulated::swiglu(gate_up, y_keeping, gate_up_kept, y_kept);
  cuda_emulated::swiglu(gate_up, y_operand);
  expect_same_bits(y_keeping, y, "swiglu keeping copies: y");
  expect_same_bits(gate_up_kept, gate_up16, "swiglu: gate_up's kept copy");
  expect_same_bits(y_kept, y.to(DType::BF16), "swiglu: y's kept copy");
  expect_same_bits(y_operand, y.to(DType::BF16), "swiglu: y written as a bf16 GEMM operand");

  const Tensor gate_up_widened = gate_up16.to(DType::F32);
  auto fresh = [&](int64_t columns) { return Tensor::full({M, columns}, NAN, DType::F32); };
  auto fresh16 = [&](int64_t columns) { return Tensor::full({M, columns}, NAN, DType::BF16); };
  Tensor dgate_up = fresh(2 * C), dgate_up_kept = fresh(2 * C), dgate_up16 = fresh16(2 * C);
  cuda_emulated::swiglu_backward(gate_up_widened, dy, dgate_up);
  cuda_emulated::swiglu_backward(gate_up16, dy, dgate_up_kept);
  cuda_emulated::swiglu_backward(gate_up16, dy, dgate_up16);
  expect_same_bits(dgate_up_kept, dgate_up, "swiglu_backward dgate_up");
  expect_same_bits(dgate_up16, dgate_up.to(DType::BF16), "swiglu_backward dgate_up in bf16");

  std::vector<int32_t> order(static_cast<size_t>(M));
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  const Tensor pos = Tensor::from_vector<int32_t>({M}, order), w = test::random_tensor({N, k}, 74, DType::F32);
  Tensor h = fresh(C), dgate_up_combined = fresh(2 * C), dw = Tensor::full({N, k}, NAN, DType::F32);
  Tensor h_kept = fresh(C), dgate_up_combined_kept = fresh(2 * C), dw_kept = Tensor::full({N, k}, NAN, DType::F32);
  cuda_emulated::swiglu_combine_backward(w, pos, gate_up_widened, dy, h, dgate_up_combined, dw);
  cuda_emulated::swiglu_combine_backward(w, pos, gate_up16, dy, h_kept, dgate_up_combined_kept, dw_kept);
  expect_same_bits(h_kept, h, "swiglu_combine_backward h");
  expect_same_bits(dgate_up_combined_kept, dgate_up_combined, "swiglu_combine_backward dgate_up");
  expect_same_bits(dw_kept, dw, "swiglu_combine_backward dw");

  Tensor h16 = fresh16(C), dgate_up_combined16 = fresh16(2 * C), dw_rounded = Tensor::full({N, k}, NAN, DType::F32);
  cuda_emulated::swiglu_combine_backward(w, pos, gate_up16, dy, h16, dgate_up_combined16, dw_rounded);
  expect_same_bits(h16, h.to(DType::BF16), "swiglu_combine_backward h in bf16");
  expect_same_bits(dgate_up_combined16, dgate_up_combined.to(DType::BF16), "swiglu_combine_backward dgate_up in bf16");
  expect_same_bits(dw_rounded, dw, "swiglu_combine_backward dw beside bf16 operands");
}

// ---- norm.cu -------------------------------------------------------------------------------------

// Rows shorter and longer than the 256-thread block, one row and many: the block's shared-memory sum
// and the column loop of dw; dx written and dx added to. Sums run in another order than the CPU's, so
// values agree to rounding.
TEST(CudaEmulation, RmsNormMatchesTheCpuKernel) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape& shape : std::vector<Shape>{{1, 1}, {3, 7}, {2, 5, 300}, {9, 1000}}) {
      const double tolerance = dtype == DType::F32 ? 1e-5 : 1e-13;
      const int64_t C = shape.back();
      const Shape lead(shape.begin(), shape.end() - 1);
      const Tensor x = test::random_tensor(shape, 21, dtype), w = test::random_tensor({C}, 22, dtype);
      const Tensor dy = test::random_tensor(shape, 23, dtype), dw0 = test::random_tensor({C}, 24, dtype);
      const Tensor dx0 = test::random_tensor(shape, 25, dtype);
      Tensor y = Tensor::empty(shape, dtype), rstd = Tensor::empty(lead, dtype);
      Tensor y_e = Tensor::empty(shape, dtype), rstd_e = Tensor::empty(lead, dtype);
      kernels::rmsnorm(x, w, 1e-6, y, rstd);
      cuda_emulated::rmsnorm(x, w, 1e-6, y_e, rstd_e);
      const std::string where = std::string(dtype_name(dtype)) + " " + Tensor::empty(shape).str();
      test::expect_close(values(y_e), values(y), tolerance, tolerance, "y " + where);
      test::expect_close(values(rstd_e), values(rstd), tolerance, tolerance, "rstd " + where);
      for (bool add_to_dx : {false, true}) {
        Tensor dx = dx0.clone(), dx_e = dx0.clone();
        Tensor dw = dw0.clone(), dw_e = dw0.clone();  // accumulated into
        kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw, add_to_dx ? 1.0 : 0.0);
        cuda_emulated::rmsnorm_backward(x, w, rstd, dy, dx_e, dw_e, add_to_dx);
        const std::string how = where + (add_to_dx ? ", dx added to" : "");
        test::expect_close(values(dx_e), values(dx), tolerance, tolerance, "dx " + how);
        test::expect_close(values(dw_e), values(dw), tolerance, tolerance, "dw " + how);
      }
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
      const std::string where = std::string(dtype_name(dtype)) + " n " + std::to_string(n);
      test::expect_close(values(p_e), values(p), tolerance, tolerance, "param " + where);
      test::expect_close(values(m_e), values(m), tolerance, tolerance, "m " + where);
      test::expect_close(values(v_e), values(v), tolerance, tolerance, "v " + where);
      if (dtype == DType::F32) {  // the bf16 copy written in the same pass is the new values' rounding
        Tensor p_copied = p0.clone(), m_copied = m0.clone(), v_copied = v0.clone();
        Tensor copy = Tensor::empty({n}, DType::BF16), want = Tensor::empty({n}, DType::BF16);
        cuda_emulated::adamw_step(p_copied, g, m_copied, v_copied, step, {}, copy);
        kernels::convert(p_copied, want);
        EXPECT_EQ(std::memcmp(copy.raw_data(), want.raw_data(), copy.nbytes()), 0) << where;
        EXPECT_EQ(std::memcmp(p_copied.raw_data(), p_e.raw_data(), p_e.nbytes()), 0) << where;
      }
      // Runs with and without decay, gaps left as they are, in one launch; then other runs, whose table
      // replaces the one the device holds.
      if (n < 10) continue;
      for (const std::vector<kernels::AdamWRun>& runs : std::vector<std::vector<kernels::AdamWRun>>{
               {{1, 5, true}, {7, n / 2, false}, {n / 2 + 1, n, true}}, {{0, 3, false}, {3, n - 2, true}}}) {
        Tensor p_runs = p0.clone(), m_runs = m0.clone(), v_runs = v0.clone();
        Tensor p_runs_e = p0.clone(), m_runs_e = m0.clone(), v_runs_e = v0.clone();
        kernels::adamw_step(p_runs, g, m_runs, v_runs, step, runs);
        cuda_emulated::adamw_step(p_runs_e, g, m_runs_e, v_runs_e, step, runs);
        const std::string how = where + " runs from " + std::to_string(runs.front().begin);
        test::expect_close(values(p_runs_e), values(p_runs), tolerance, tolerance, "param " + how);
        test::expect_close(values(m_runs_e), values(m_runs), tolerance, tolerance, "m " + how);
        test::expect_close(values(v_runs_e), values(v_runs), tolerance, tolerance, "v " + how);
      }
    }
}

// ---- elementwise.cu: the factor read on the device, and sum_to -----------------------------------

TEST(CudaEmulation, ScaleByAxpyByAndSumToMatchTheCpuKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t n : kSizes) {
      const std::string where = std::string(dtype_name(dtype)) + " n " + std::to_string(n);
      const Tensor x = test::random_tensor({n}, 51, dtype), y0 = test::random_tensor({n}, 52, dtype);
      const Tensor s = Tensor::full({1}, -0.3, dtype);
      Tensor scaled = Tensor::empty({n}, dtype), scaled_e = Tensor::full({n}, NAN, dtype);
      kernels::scale_by(x, s, 1.7, scaled);
      cuda_emulated::axpby_by(s, 1.7, x, 0.0, scaled_e);
      expect_same_bits(scaled_e, scaled, "scale_by " + where);
      Tensor y = y0.clone(), y_e = y0.clone();
      kernels::axpy_by(s, 2.5, x, y);
      cuda_emulated::axpby_by(s, 2.5, x, 1.0, y_e);
      expect_same_bits(y_e, y, "axpy_by " + where);
    }
  // Columns in row order on both backends: bit for bit, for one row, many rows, and many columns.
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {7, 3}, {300, 9}, {3, 700}}) {
      const Tensor x = test::random_tensor({rows, cols}, 53, dtype);
      Tensor out = Tensor::empty({cols}, dtype), out_e = Tensor::full({cols}, NAN, dtype);
      kernels::sum_to(x, out);
      cuda_emulated::sum_to(x, out_e);
      expect_same_bits(
          out_e, out,
          "sum_to " + std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
    }
}

// ---- reduce.cu -----------------------------------------------------------------------------------

// Sizes past one block and past the 1024 first-pass blocks (grid-stride loops in both passes). The GPU
// adds in f64 and the CPU in the dtype, so they agree to the dtype's rounding of a long sum.
TEST(CudaEmulation, ReductionsMatchTheCpuKernels) {
  // 300000 elements (past 1024 blocks of 256: the first pass's grid-stride loop) in f32 only: emulated
  // barriers cost real context switches, and the loop's indexing is the same in f64.
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{1000}, int64_t{300000}}) {
      if (dtype == DType::F64 && n > 1000) continue;
      const double tolerance = dtype == DType::F32 ? 2e-5 : 1e-12;
      const std::string where = std::string(dtype_name(dtype)) + " n " + std::to_string(n);
      const Tensor x = test::random_tensor({n}, 61, dtype);
      Tensor total = Tensor::empty({1}, dtype), total_e = Tensor::empty({1}, dtype);
      kernels::sum(x, total);
      cuda_emulated::sum(x, total_e);
      // A sum of n signed values can be near 0: scale the tolerance by the sum of magnitudes (~0.8 n).
      test::expect_close(values(total_e), values(total), 0.0, tolerance * static_cast<double>(n), "sum " + where);
      kernels::sum_squares(x, total);
      cuda_emulated::sum_squares(x, total_e);
      test::expect_close(values(total_e), values(total), tolerance, 0.0, "sum_squares " + where);
    }
  for (DType dtype : {DType::F32, DType::F64})
    for (const Shape& shape : std::vector<Shape>{{1, 1}, {3, 7}, {2, 5, 300}}) {
      const double tolerance = dtype == DType::F32 ? 1e-5 : 1e-13;
      const Tensor x = test::random_tensor(shape, 62, dtype);
      const Shape lead(shape.begin(), shape.end() - 1);
      Tensor out = Tensor::empty(lead, dtype), out_e = Tensor::empty(lead, dtype);
      kernels::sum_last_dim(x, out);
      cuda_emulated::sum_last_dim(x, out_e);
      test::expect_close(values(out_e), values(out), tolerance, tolerance * shape.back(),
                         "sum_last_dim " + std::string(dtype_name(dtype)));
    }
}

// ---- softmax.cu: cross-entropy; reduce.cu: the mean over counted targets ---------------------------

// Targets: i32 and i64, some ignored, one at the last column; large logits (the max shift); rows
// shorter and longer than the block.
TEST(CudaEmulation, CrossEntropyAndTheMeanOverTargetsMatchTheCpuKernels) {
  constexpr int64_t kIgnore = -100;
  for (DType dtype : {DType::F32, DType::F64})
    for (DType id_dtype : {DType::I32, DType::I64})
      for (const auto& [N, V] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 7}, {9, 300}, {3, 3000}}) {
        const double tolerance = dtype == DType::F32 ? 1e-5 : 1e-13;
        const std::string where = std::string(dtype_name(dtype)) + " " + dtype_name(id_dtype) + " [" +
                                  std::to_string(N) + ", " + std::to_string(V) + "]";
        Tensor logits = Tensor::empty({N, V}, dtype);
        kernels::scale(test::random_tensor({N, V}, 71, dtype), 20.0, logits);
        std::vector<int64_t> ids(static_cast<size_t>(N));
        for (int64_t n = 0; n < N; ++n) ids[static_cast<size_t>(n)] = n % 3 == 1 ? kIgnore : (n * 7919) % V;
        ids.back() = N > 2 ? V - 1 : ids.back();
        const Tensor targets = Tensor::from_vector({N}, ids).to(id_dtype);
        Tensor loss = Tensor::empty({N}, dtype), lse = Tensor::empty({N}, dtype);
        Tensor loss_e = Tensor::full({N}, NAN, dtype), lse_e = Tensor::full({N}, NAN, dtype);
        kernels::cross_entropy(logits, targets, kIgnore, loss, lse);
        cuda_emulated::cross_entropy(logits, targets, kIgnore, loss_e, lse_e);
        test::expect_close(values(loss_e), values(loss), tolerance, tolerance, "loss " + where);
        test::expect_close(values(lse_e), values(lse), tolerance, tolerance, "lse " + where);
        const Tensor dloss = test::random_tensor({N}, 72, dtype);
        Tensor dlogits = Tensor::empty({N, V}, dtype), dlogits_e = Tensor::full({N, V}, NAN, dtype);
        kernels::cross_entropy_backward(logits, targets, kIgnore, lse, dloss, dlogits);
        cuda_emulated::cross_entropy_backward(logits, targets, kIgnore, lse, dloss, dlogits_e);
        test::expect_close(values(dlogits_e), values(dlogits), tolerance, tolerance, "dlogits " + where);

        Tensor count = Tensor::empty({1}, DType::I64), count_e = Tensor::full({1}, -1.0, DType::I64);
        kernels::count_targets(targets, kIgnore, count);
        cuda_emulated::count_targets(targets, kIgnore, count_e);
        expect_same_bits(count_e, count, "count " + where);
        Tensor mean = Tensor::empty({1}, dtype), mean_e = Tensor::empty({1}, dtype);
        kernels::mean_over_count(loss, count, mean);
        cuda_emulated::mean_over_count(loss, count, mean_e);
        test::expect_close(values(mean_e), values(mean), tolerance, tolerance, "mean " + where);
        const Tensor dmean = Tensor::full({1}, 0.7, dtype);
        Tensor dvalues = Tensor::empty({N}, dtype), dvalues_e = Tensor::empty({N}, dtype);
        kernels::mean_over_count_backward(dmean, count, dvalues);
        cuda_emulated::mean_over_count_backward(dmean, count, dvalues_e);
        expect_same_bits(dvalues_e, dvalues, "mean backward " + where);
      }
  // Every target ignored: count 0, mean 0 and a zero backward, as on the CPU.
  const Tensor ignored = Tensor::full({4}, static_cast<double>(kIgnore), DType::I64);
  Tensor count = Tensor::full({1}, 5.0, DType::I64), mean = Tensor::full({1}, NAN), dvalues = Tensor::full({4}, NAN);
  cuda_emulated::count_targets(ignored, kIgnore, count);
  EXPECT_EQ(count.data<int64_t>()[0], 0);
  cuda_emulated::mean_over_count(test::random_tensor({4}, 73), count, mean);
  EXPECT_EQ(mean.item(), 0.0);
  cuda_emulated::mean_over_count_backward(Tensor::full({1}, 1.0), count, dvalues);
  EXPECT_EQ(values(dvalues), std::vector<double>(4, 0.0));
}

// ---- index.cu ------------------------------------------------------------------------------------

// The device-side range check finds the first bad id (not just any), also past the first block and
// in the second pass; an ignored id is allowed only where the range says so.
TEST(CudaEmulation, TheDeviceRangeCheckFindsTheFirstOutOfRangeId) {
  for (DType id_dtype : {DType::I32, DType::I64})
    for (int64_t n : {int64_t{1}, int64_t{300}, int64_t{70000}}) {
      if (id_dtype == DType::I64 && n > 300) continue;  // the long case once: emulated barriers are slow
      std::vector<int64_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i % 50;
      const std::string where = std::string(dtype_name(id_dtype)) + " n " + std::to_string(n);
      kernels::OutOfRange none =
          cuda_emulated::first_out_of_range(Tensor::from_vector({n}, ids).to(id_dtype), kernels::IndexRange{50});
      EXPECT_EQ(none.position, -1) << where;
      // Two bad ids; the earlier one must be reported. -100 is allowed only as the ignored id.
      const int64_t first = n * 2 / 3, second = n - 1;
      ids[static_cast<size_t>(second)] = 50;
      ids[static_cast<size_t>(first)] = -100;
      const Tensor bad = Tensor::from_vector({n}, ids).to(id_dtype);
      const kernels::OutOfRange found = cuda_emulated::first_out_of_range(bad, kernels::IndexRange{50});
      EXPECT_EQ(found.position, first) << where;
      EXPECT_EQ(found.value, -100) << where;
      const kernels::OutOfRange past_ignored =
          cuda_emulated::first_out_of_range(bad, kernels::IndexRange{50, true, -100});
      EXPECT_EQ(past_ignored.position, first == second ? -1 : second) << where;
      if (first != second) {
        EXPECT_EQ(past_ignored.value, 50) << where;
      }
    }
}

TEST(CudaEmulation, GathersAndScatterAddsMatchTheCpuKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (DType id_dtype : {DType::I32, DType::I64})
      for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{3, 1}, {11, 7}, {40, 300}}) {
        const std::string where = std::string(dtype_name(dtype)) + " " + dtype_name(id_dtype) + " [" +
                                  std::to_string(rows) + ", " + std::to_string(cols) + "]";
        // Rows: repeated ids (the scatter-add's order matters), in a pattern that is not sorted.
        const int64_t n = 2 * rows + 1;
        std::vector<int64_t> row_ids(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) row_ids[static_cast<size_t>(i)] = (i * 5 + 2) % rows;
        const Tensor idx = Tensor::from_vector({n}, row_ids).to(id_dtype);
        const Tensor table = test::random_tensor({rows, cols}, 81, dtype);
        Tensor out = Tensor::empty({n, cols}, dtype), out_e = Tensor::full({n, cols}, NAN, dtype);
        kernels::gather_rows(table, idx, out);
        cuda_emulated::gather_rows(table, idx, out_e);
        expect_same_bits(out_e, out, "gather_rows " + where);
        if (dtype == DType::F32) {
          // Into bf16 rows (a mixed-precision GEMM's operand), from the f32 table rounded as it is read and
          // from its bf16 copy as it is: the rounding of the gathered rows either way.
          for (const Tensor& from : {table, table.to(DType::BF16)}) {
            Tensor out16 = Tensor::full({n, cols}, NAN, DType::BF16);
            cuda_emulated::gather_rows(from, idx, out16);
            expect_same_bits(out16, out.to(DType::BF16),
                             "gather_rows into bf16 from " + std::string(dtype_name(from.dtype())) + " " + where);
          }
        }
        const Tensor src = test::random_tensor({n, cols}, 82, dtype),
                     acc0 = test::random_tensor({rows, cols}, 83, dtype);
        Tensor acc = acc0.clone(), acc_e = acc0.clone();
        kernels::scatter_add_rows(src, idx, acc);
        cuda_emulated::scatter_add_rows(src, idx, acc_e);
        expect_same_bits(acc_e, acc, "scatter_add_rows " + where);

        // Columns: k picks per row, with a repeat in each row.
        const int64_t k = std::min<int64_t>(cols, 3) + 1;
        std::vector<int64_t> col_ids(static_cast<size_t>(rows * k));
        for (int64_t i = 0; i < rows * k; ++i) col_ids[static_cast<size_t>(i)] = (i % k == k - 1) ? 0 : (i * 3) % cols;
        const Tensor cidx = Tensor::from_vector({rows, k}, col_ids).to(id_dtype);
        Tensor picked = Tensor::empty({rows, k}, dtype), picked_e = Tensor::full({rows, k}, NAN, dtype);
        kernels::gather_cols(table, cidx, picked);
        cuda_emulated::gather_cols(table, cidx, picked_e);
        expect_same_bits(picked_e, picked, "gather_cols " + where);
        const Tensor dout = test::random_tensor({rows, k}, 84, dtype);
        Tensor dx = acc0.clone(), dx_e = acc0.clone();
        kernels::scatter_add_cols(dout, cidx, dx);
        cuda_emulated::scatter_add_cols(dout, cidx, dx_e);
        expect_same_bits(dx_e, dx, "scatter_add_cols " + where);
      }
}

// The shared TopKRow: ties go to the lower index, NaN ranks above everything.
TEST(CudaEmulation, TopKMatchesTheCpuKernel) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [rows, cols, k] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {7, 8, 2}, {300, 64, 6}, {3, 5, 5}}) {
      Tensor x = test::random_tensor({rows, cols}, 91, dtype);
      std::vector<double> v = values(x);
      for (size_t i = 0; i < v.size(); i += 7) v[i] = 0.25;  // ties
      if (v.size() > 3) v[3] = NAN;
      x = Tensor::from_vector({rows, cols}, v).to(dtype);
      Tensor best = Tensor::empty({rows, k}, dtype), best_e = Tensor::empty({rows, k}, dtype);
      Tensor ids = Tensor::empty({rows, k}, DType::I32), ids_e = Tensor::empty({rows, k}, DType::I32);
      kernels::topk(x, k, best, ids);
      cuda_emulated::topk(x, k, best_e, ids_e);
      const std::string where = std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "] k " + std::to_string(k);
      expect_same_bits(best_e, best, "values " + where);
      expect_same_bits(ids_e, ids, "indices " + where);
    }
}

// ---- slice.cu, normhead.cu -------------------------------------------------------------------------

TEST(CudaEmulation, ColumnSlicesAndNormHeadScalesMatchTheCpuKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [rows, C, start, W] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
             {1, 1, 0, 1}, {5, 9, 2, 4}, {300, 33, 0, 33}, {2, 700, 300, 400}}) {
      const std::string where = std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " +
                                std::to_string(C) + "] columns " + std::to_string(start) + " + " + std::to_string(W);
      const Tensor wide = test::random_tensor({rows, C}, 101, dtype);
      Tensor narrow = Tensor::empty({rows, W}, dtype), narrow_e = Tensor::full({rows, W}, NAN, dtype);
      kernels::copy_cols(wide, start, narrow);
      cuda_emulated::copy_cols(wide, start, narrow_e);
      expect_same_bits(narrow_e, narrow, "copy_cols " + where);
      const Tensor add = test::random_tensor({rows, W}, 102, dtype);
      Tensor sum = wide.clone(), sum_e = wide.clone();
      kernels::add_to_cols(add, start, sum);
      cuda_emulated::add_to_cols(add, start, sum_e);
      expect_same_bits(sum_e, sum, "add_to_cols " + where);
      // The head w [V, H] = [rows, C]: per-column f64 sums in row order on both backends.
      Tensor inv = Tensor::empty({C}, dtype), inv_e = Tensor::full({C}, NAN, dtype);
      kernels::column_inv_norm(wide, 1e-6, inv);
      cuda_emulated::column_inv_norm(wide, 1e-6, inv_e);
      expect_same_bits(inv_e, inv, "column_inv_norm " + where);
    }
}

// ---- column_sums.h (sum_to, RMSNorm's dw, NormHead's norms) and the sorted scatter-add ----------------

// Past one chunk of 64 rows (64 and 65 on either side of the first boundary, a partial last chunk, 6
// chunks) and one tile of 128 columns (a partial last tile): sum_to and the column norms bit for bit
// with the CPU, which adds in the same chunked order; dw to rounding (the CPU cuts its own chunks there),
// on fewer rows (each dx row is a block of emulated threads). Each kernel run twice gives the same bits.
TEST(CudaEmulation, ColumnSumsOverSeveralChunksAndTilesMatchTheCpuKernels) {
  using Shapes = std::vector<std::pair<int64_t, int64_t>>;
  for (DType dtype : {DType::F32, DType::F64}) {
    for (const auto& [rows, cols] : Shapes{{64, 1}, {65, 129}, {197, 293}, {330, 3}}) {
      const std::string where = std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]";
      const Tensor x = test::random_tensor({rows, cols}, 111, dtype);
      Tensor sums = Tensor::empty({cols}, dtype), sums_e = Tensor::full({cols}, NAN, dtype);
      Tensor sums_again = Tensor::full({cols}, NAN, dtype);
      kernels::sum_to(x, sums);
      cuda_emulated::sum_to(x, sums_e);
      cuda_emulated::sum_to(x, sums_again);
      expect_same_bits(sums_e, sums, "sum_to " + where);
      expect_same_bits(sums_again, sums_e, "sum_to twice " + where);

      Tensor inv = Tensor::empty({cols}, dtype), inv_e = Tensor::full({cols}, NAN, dtype);
      Tensor inv_again = Tensor::full({cols}, NAN, dtype);
      kernels::column_inv_norm(x, 1e-6, inv);
      cuda_emulated::column_inv_norm(x, 1e-6, inv_e);
      cuda_emulated::column_inv_norm(x, 1e-6, inv_again);
      expect_same_bits(inv_e, inv, "column_inv_norm " + where);
      expect_same_bits(inv_again, inv_e, "column_inv_norm twice " + where);
    }
    for (const auto& [rows, cols] : Shapes{{65, 129}, {197, 3}}) {
      const double tolerance = dtype == DType::F32 ? 1e-5 : 1e-13;
      const std::string where = std::string(dtype_name(dtype)) + " [" + std::to_string(rows) + ", " +
                                std::to_string(cols) + "]";
      const Tensor x = test::random_tensor({rows, cols}, 111, dtype), w = test::random_tensor({cols}, 112, dtype);
      const Tensor dy = test::random_tensor({rows, cols}, 113, dtype), dw0 = test::random_tensor({cols}, 114, dtype);
      Tensor y = Tensor::empty({rows, cols}, dtype), rstd = Tensor::empty({rows}, dtype);
      kernels::rmsnorm(x, w, 1e-6, y, rstd);
      Tensor dx = Tensor::empty({rows, cols}, dtype), dx_e = dx.clone(), dx_again = dx.clone();
      Tensor dw = dw0.clone(), dw_e = dw0.clone(), dw_again = dw0.clone();
      kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw);
      cuda_emulated::rmsnorm_backward(x, w, rstd, dy, dx_e, dw_e, false);
      cuda_emulated::rmsnorm_backward(x, w, rstd, dy, dx_again, dw_again, false);
      test::expect_close(values(dw_e), values(dw), tolerance, tolerance, "rmsnorm dw " + where);
      expect_same_bits(dw_again, dw_e, "rmsnorm dw twice " + where);
    }
  }
}

// Source rows across several sort chunks of 256 (one short of a chunk, one past it, three with a partial
// last one), a row that takes every third source row, rows no source row names, ids not sorted, and
// rows wider than the segment block's 256 threads: bit for bit with the CPU, which adds each output
// row's contributions in source order, as the segments do. Run twice, the same bits.
TEST(CudaEmulation, ScatterAddRowsAsSortedSegmentsMatchesTheCpuKernel) {
  for (DType dtype : {DType::F32, DType::F64})
    for (DType id_dtype : {DType::I32, DType::I64})
      for (const auto& [n, cols] : std::vector<std::pair<int64_t, int64_t>>{{255, 3}, {257, 300}, {520, 1}}) {
        const int64_t rows = 50;  // ids reach rows 0..40 only: 41..49 receive nothing
        std::vector<int64_t> ids(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = i % 3 == 0 ? 7 : (i * 13 + i / 5) % 41;
        const Tensor idx = Tensor::from_vector({n}, ids).to(id_dtype);
        const Tensor src = test::random_tensor({n, cols}, 121, dtype);
        const Tensor acc0 = test::random_tensor({rows, cols}, 122, dtype);
        Tensor acc = acc0.clone(), acc_e = acc0.clone(), acc_again = acc0.clone();
        kernels::scatter_add_rows(src, idx, acc);
        cuda_emulated::scatter_add_rows(src, idx, acc_e);
        cuda_emulated::scatter_add_rows(src, idx, acc_again);
        const std::string where = std::string(dtype_name(dtype)) + " " + dtype_name(id_dtype) + " n " +
                                  std::to_string(n) + " cols " + std::to_string(cols);
        expect_same_bits(acc_e, acc, "scatter_add_rows " + where);
        expect_same_bits(acc_again, acc_e, "scatter_add_rows twice " + where);
      }
}

// ---- rope.cu -------------------------------------------------------------------------------------

// Head dims whose half is and is not a multiple of the CPU vector width (its scalar tail rounds the
// pair a*c - b*s in another order), GQA shapes, a position offset, and RoPE in place.
TEST(CudaEmulation, RopeAndTheFusedQkvSplitMatchTheCpuKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [B, T, Hq, Hkv, D] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
             {1, 1, 1, 1, 2}, {2, 5, 4, 2, 6}, {1, 33, 3, 1, 64}}) {
      const double tolerance = dtype == DType::F32 ? 1e-6 : 1e-14;
      const std::string where = std::string(dtype_name(dtype)) + " B " + std::to_string(B) + " T " + std::to_string(T) +
                                " Hq " + std::to_string(Hq) + " Hkv " + std::to_string(Hkv) + " D " + std::to_string(D);
      const double theta = 600000.0;
      const int64_t offset = 4093;
      const Tensor x = test::random_tensor({B, T, Hq, D}, 111, dtype);
      for (bool inverse : {false, true}) {
        Tensor y = Tensor::empty({B, T, Hq, D}, dtype), y_e = x.clone();  // y_e: in place
        kernels::rope(x, theta, offset, inverse, y);
        cuda_emulated::rope(y_e, theta, offset, inverse, y_e);
        test::expect_close(values(y_e), values(y), tolerance, tolerance, (inverse ? "rope^-1 " : "rope ") + where);
      }
      const int64_t C = (Hq + 2 * Hkv) * D;
      const Tensor qkv = test::random_tensor({B, T, C}, 112, dtype);
      Tensor q = Tensor::empty({B, T, Hq, D}, dtype), k = Tensor::empty({B, T, Hkv, D}, dtype);
      Tensor v = Tensor::empty({B, T, Hkv, D}, dtype);
      Tensor q_e = Tensor::full({B, T, Hq, D}, NAN, dtype), k_e = Tensor::full({B, T, Hkv, D}, NAN, dtype);
      Tensor v_e = Tensor::full({B, T, Hkv, D}, NAN, dtype);
      kernels::split_qkv_rope(qkv, theta, offset, q, k, v);
      cuda_emulated::split_qkv_rope(qkv, theta, offset, q_e, k_e, v_e);
      test::expect_close(values(q_e), values(q), tolerance, tolerance, "q " + where);
      test::expect_close(values(k_e), values(k), tolerance, tolerance, "k " + where);
      expect_same_bits(v_e, v, "v " + where);
      Tensor dqkv = Tensor::empty({B, T, C}, dtype), dqkv_e = Tensor::full({B, T, C}, NAN, dtype);
      kernels::split_qkv_rope_backward(q, k, v, theta, offset, dqkv);
      cuda_emulated::split_qkv_rope_backward(q, k, v, theta, offset, dqkv_e);
      test::expect_close(values(dqkv_e), values(dqkv), tolerance, tolerance, "dqkv " + where);
    }
}

// The split into a KV cache: rows at different positions (one at a large offset), several new positions
// per row, GQA; the cache rows outside the new positions keep their values.
TEST(CudaEmulation, SplitQkvRopeToCacheMatchesTheCpuKernel) {
  for (DType dtype : {DType::F32, DType::F64}) {
    const int64_t B = 3, T = 2, Hq = 4, Hkv = 2, D = 6, capacity = 4100, C = (Hq + 2 * Hkv) * D;
    const std::vector<int64_t> Tk_B = {0, 4093, 17};
    const double tolerance = dtype == DType::F32 ? 1e-6 : 1e-14;
    const Tensor qkv = test::random_tensor({B, T, C}, 114, dtype);
    const Tensor cache = test::random_tensor({B, capacity, Hkv, D}, 115, dtype);
    Tensor q = Tensor::empty({B, T, Hq, D}, dtype), q_e = Tensor::full({B, T, Hq, D}, NAN, dtype);
    Tensor k = cache.clone(), v = cache.clone(), k_e = cache.clone(), v_e = cache.clone();
    kernels::split_qkv_rope_to_cache(qkv, 600000.0, Tk_B, q, k, v);
    cuda_emulated::split_qkv_rope_to_cache(qkv, 600000.0, Tk_B, q_e, k_e, v_e);
    test::expect_close(values(q_e), values(q), tolerance, tolerance, std::string("q ") + dtype_name(dtype));
    test::expect_close(values(k_e), values(k), tolerance, tolerance, std::string("k cache ") + dtype_name(dtype));
    expect_same_bits(v_e, v, std::string("v cache ") + dtype_name(dtype));
  }
}

// ---- attention.cu --------------------------------------------------------------------------------

// The doc_start of documents of the given lengths packed into each of B rows of length T.
Tensor packed_doc_start(int64_t B, int64_t T, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> starts;
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (size_t d = 0; t < T; d = (d + 1) % lengths.size())
      for (int64_t i = 0; i < lengths[d] && t < T; ++i) starts.push_back(static_cast<int32_t>(t - i)), ++t;
  }
  return Tensor::from_vector<int32_t>({B, T}, starts);
}

// Lengths that leave partial tiles (16 in f32, 8 in f64), GQA groups of 1, 2 and 4, the largest head
// dim, and packed documents whose boundaries fall inside tiles and on their edges.
TEST(CudaEmulation, AttentionForwardAndBackwardMatchTheCpuKernel) {
  struct Case {
    int64_t B, T, Hq, Hkv, D;
    std::vector<int64_t> documents;  // empty: one causal sequence per row
  };
  const std::vector<Case> cases = {{1, 1, 1, 1, 4, {}},
                                   {2, 37, 4, 2, 24, {}},
                                   {1, 20, 4, 1, 128, {}},
                                   {1, 45, 2, 2, 8, {5, 16, 3}},
                                   {2, 33, 2, 1, 16, {8, 1, 24}}};
  for (DType dtype : {DType::F32, DType::F64})
    for (const Case& c : cases) {
      const double tolerance = dtype == DType::F32 ? 2e-5 : 1e-12;
      const std::string where = std::string(dtype_name(dtype)) + " B " + std::to_string(c.B) + " T " +
                                std::to_string(c.T) + " Hq " + std::to_string(c.Hq) + " Hkv " + std::to_string(c.Hkv) +
                                " D " + std::to_string(c.D) + (c.documents.empty() ? "" : " packed");
      const Tensor doc_start = c.documents.empty() ? Tensor() : packed_doc_start(c.B, c.T, c.documents);
      const Tensor q = test::random_tensor({c.B, c.T, c.Hq, c.D}, 121, dtype);
      const Tensor k = test::random_tensor({c.B, c.T, c.Hkv, c.D}, 122, dtype);
      const Tensor v = test::random_tensor({c.B, c.T, c.Hkv, c.D}, 123, dtype);
      const Tensor dout = test::random_tensor({c.B, c.T, c.Hq, c.D}, 124, dtype);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      Tensor out = Tensor::empty(q.shape(), dtype), lse = Tensor::empty({c.B, c.Hq, c.T}, dtype);
      Tensor out_e = Tensor::full(q.shape(), NAN, dtype), lse_e = Tensor::full({c.B, c.Hq, c.T}, NAN, dtype);
      kernels::attention(q, k, v, scale, out, lse, doc_start);
      cuda_emulated::attention(q, k, v, scale, out_e, lse_e, doc_start);
      test::expect_close(values(out_e), values(out), tolerance, tolerance, "out " + where);
      test::expect_close(values(lse_e), values(lse), tolerance, tolerance, "lse " + where);
      // The backwards from the same (CPU) forward outputs.
      Tensor dq = Tensor::empty(q.shape(), dtype), dk = Tensor::empty(k.shape(), dtype);
      Tensor dv = Tensor::empty(k.shape(), dtype);
      Tensor dq_e = Tensor::full(q.shape(), NAN, dtype), dk_e = Tensor::full(k.shape(), NAN, dtype);
      Tensor dv_e = Tensor::full(k.shape(), NAN, dtype);
      kernels::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, doc_start);
      cuda_emulated::attention_backward(q, k, v, out, lse, dout, scale, dq_e, dk_e, dv_e, doc_start);
      test::expect_close(values(dq_e), values(dq), tolerance, tolerance, "dq " + where);
      test::expect_close(values(dk_e), values(dk), tolerance, tolerance, "dk " + where);
      test::expect_close(values(dv_e), values(dv), tolerance, tolerance, "dv " + where);
    }
}

// The tensor-core path (mixed precision on f32 tensors): q, k, v and dout enter the products as bf16,
// P and dS are rounded to bf16 for the second products, sums and softmax statistics stay f32. The
// reference is the CPU kernel (exact f32) on q, k, v and dout rounded to bf16, so what is left between
// the two is the rounding of P and dS (relative u = 2^-9 each) and f32 sums in another order.
// Tolerances: out_i = sum_j p_ij v_j / l_i moves by at most u sum_j p_ij |v_j| / l_i <= u max|v|, about
// 8e-3 for these normal draws (|v| < 4), taken as the absolute tolerance; lse sees no rounding of its
// own (l sums the f32 P), so f32's 2e-5 holds, and that also shows that the scores are those of the
// bf16 inputs (unrounded ones would move it by ~1e-3). A gradient element sums up to T products with a
// rounded P or dS factor: u sum_j |dS_ij| |k_j| and the like, a few u |x| at most, so 1e-2 relative
// plus 1e-2 absolute. Seen: out 3e-3, the gradients 9e-3 at most (at magnitudes up to 8).
TEST(CudaEmulation, AttentionOnTensorCoresMatchesTheCpuKernelOnBf16Inputs) {
  struct Case {
    int64_t B, T, Hq, Hkv, D;
    std::vector<int64_t> documents;  // empty: one causal sequence per row
  };
  const std::vector<Case> cases = {{1, 100, 4, 2, 128, {}},
                                   {1, 100, 4, 2, 64, {30, 7, 50}},
                                   {2, 37, 2, 1, 24, {5, 16, 3}},
                                   {1, 1, 1, 1, 16, {}}};
  struct Precision {  // the mixed precision of --dtype bf16 for the test's length, whatever happens
    Precision() { kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs); }
    ~Precision() { kernels::set_matmul_precision(kernels::MatmulPrecision::F32); }
  } precision;
  auto bf16 = [](const Tensor& x) { return x.to(DType::BF16).to(DType::F32); };
  for (const Case& c : cases) {
    const std::string where = "B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " Hq " + std::to_string(c.Hq) +
                              " Hkv " + std::to_string(c.Hkv) + " D " + std::to_string(c.D) +
                              (c.documents.empty() ? "" : " packed");
    const Tensor doc_start = c.documents.empty() ? Tensor() : packed_doc_start(c.B, c.T, c.documents);
    const Tensor q = test::random_tensor({c.B, c.T, c.Hq, c.D}, 131);
    const Tensor k = test::random_tensor({c.B, c.T, c.Hkv, c.D}, 132);
    const Tensor v = test::random_tensor({c.B, c.T, c.Hkv, c.D}, 133);
    const Tensor dout = test::random_tensor({c.B, c.T, c.Hq, c.D}, 134);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
    // The reference in f32 (the CPU kernel's own bf16 products would round P and dS too).
    kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
    Tensor out = Tensor::empty(q.shape()), lse = Tensor::empty({c.B, c.Hq, c.T});
    kernels::attention(bf16(q), bf16(k), bf16(v), scale, out, lse, doc_start);
    Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()), dv = Tensor::empty(k.shape());
    kernels::attention_backward(bf16(q), bf16(k), bf16(v), out, lse, bf16(dout), scale, dq, dk, dv, doc_start);
    kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
    auto on_tensor_cores = [&] {
      Tensor out_e = Tensor::full(q.shape(), NAN), lse_e = Tensor::full({c.B, c.Hq, c.T}, NAN);
      cuda_emulated::attention(q, k, v, scale, out_e, lse_e, doc_start);
      // The backward from the same (CPU) forward outputs.
      Tensor dq_e = Tensor::full(q.shape(), NAN), dk_e = Tensor::full(k.shape(), NAN);
      Tensor dv_e = Tensor::full(k.shape(), NAN);
      cuda_emulated::attention_backward(q, k, v, out, lse, dout, scale, dq_e, dk_e, dv_e, doc_start);
      return std::vector<Tensor>{out_e, lse_e, dq_e, dk_e, dv_e};
    };
    const std::vector<Tensor> first = on_tensor_cores(), second = on_tensor_cores();
    const std::vector<Tensor> expected = {out, lse, dq, dk, dv};
    const std::vector<std::string> names = {"out ", "lse ", "dq ", "dk ", "dv "};
    const std::vector<std::pair<double, double>> rtol_atol = {{0.0, 8e-3}, {2e-5, 2e-5}, {1e-2, 1e-2}, {1e-2, 1e-2},
                                                             {1e-2, 1e-2}};
    for (size_t i = 0; i < first.size(); ++i) {
      test::expect_close(values(first[i]), values(expected[i]), rtol_atol[i].first, rtol_atol[i].second,
                         names[i] + where);
      expect_same_bits(second[i], first[i], names[i] + "run twice " + where);
    }
  }
}

// Under mixed precision the backwards read q, k, v and out (or the fused projection qkv and out) as
// autograd kept them, bf16 copies, widening each element as they read it (the split and RoPE of qkv
// too): the same bits as the kernels on the widened f32 tensors. The fused forward writes the copies of
// qkv and out it is given.
TEST(CudaEmulation, AttentionWritesAndItsBackwardsReadKeptBf16Copies) {
  struct Precision {  // the mixed precision of --dtype bf16 for the test's length, whatever happens
    Precision() { kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs); }
    ~Precision() { kernels::set_matmul_precision(kernels::MatmulPrecision::F32); }
  } precision;
  auto widened = [](const Tensor& kept) { return kept.to(DType::F32); };
  auto fresh = [](const Shape& shape) { return Tensor::full(shape, NAN, DType::F32); };
  const int64_t B = 2, T = 37, Hq = 4, Hkv = 2, D = 24;
  const Tensor doc_start = packed_doc_start(B, T, {5, 16, 3});
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (const Tensor& documents : {Tensor(), doc_start}) {
    const std::string where = documents.defined() ? " packed" : "";
    const Tensor q16 = test::random_tensor({B, T, Hq, D}, 141).to(DType::BF16);
    const Tensor k16 = test::random_tensor({B, T, Hkv, D}, 142).to(DType::BF16);
    const Tensor v16 = test::random_tensor({B, T, Hkv, D}, 143).to(DType::BF16);
    const Tensor dout = test::random_tensor({B, T, Hq, D}, 144);
    Tensor out = fresh({B, T, Hq, D}), lse = fresh({B, Hq, T});
    cuda_emulated::attention(widened(q16), widened(k16), widened(v16), scale, out, lse, documents);
    const Tensor out16 = out.to(DType::BF16);
    Tensor dq = fresh(dout.shape()), dk = fresh(k16.shape()), dv = fresh(k16.shape());
    Tensor dq_kept = fresh(dout.shape()), dk_kept = fresh(k16.shape()), dv_kept = fresh(k16.shape());
    cuda_emulated::attention_backward(widened(q16), widened(k16), widened(v16), widened(out16), lse, dout, scale, dq,
                                      dk, dv, documents);
    cuda_emulated::attention_backward(q16, k16, v16, out16, lse, dout, scale, dq_kept, dk_kept, dv_kept, documents);
    expect_same_bits(dq_kept, dq, "attention_backward dq" + where);
    expect_same_bits(dk_kept, dk, "attention_backward dk" + where);
    expect_same_bits(dv_kept, dv, "attention_backward dv" + where);

    const Tensor qkv16 = test::random_tensor({B, T, (Hq + 2 * Hkv) * D}, 145).to(DType::BF16);
    Tensor qkv_out = fresh({B, T, Hq, D}), qkv_lse = fresh({B, Hq, T});
    cuda_emulated::qkv_attention(widened(qkv16), Hq, Hkv, 10000.0, 3, scale, qkv_out, qkv_lse, documents);
    const Tensor qkv_out16 = qkv_out.to(DType::BF16);
    // The forward writing the kept copies of qkv and out: their roundings, out and lse unchanged.
    const Tensor qkv = test::random_tensor(qkv16.shape(), 146);
    Tensor plain_out = fresh(qkv_out.shape()), plain_lse = fresh(qkv_lse.shape());
    Tensor keeping_out = fresh(qkv_out.shape()), keeping_lse = fresh(qkv_lse.shape());
    Tensor qkv_kept = Tensor::full(qkv.shape(), NAN, DType::BF16);
    Tensor out_kept = Tensor::full(qkv_out.shape(), NAN, DType::BF16);
    cuda_emulated::qkv_attention(qkv, Hq, Hkv, 10000.0, 3, scale, plain_out, plain_lse, documents);
    cuda_emulated::qkv_attention(qkv, Hq, Hkv, 10000.0, 3, scale, keeping_out, keeping_lse, documents, qkv_kept,
                                 out_kept);
    expect_same_bits(keeping_out, plain_out, "qkv_attention keeping copies: out" + where);
    expect_same_bits(keeping_lse, plain_lse, "qkv_attention keeping copies: lse" + where);
    expect_same_bits(qkv_kept, qkv.to(DType::BF16), "qkv_attention: qkv's kept copy" + where);
    expect_same_bits(out_kept, plain_out.to(DType::BF16), "qkv_attention: out's kept copy" + where);
    Tensor dqkv = fresh(qkv16.shape()), dqkv_kept = fresh(qkv16.shape());
    cuda_emulated::qkv_attention_backward(widened(qkv16), Hq, Hkv, 10000.0, 3, widened(qkv_out16), qkv_lse, dout,
                                          scale, dqkv, documents);
    cuda_emulated::qkv_attention_backward(qkv16, Hq, Hkv, 10000.0, 3, qkv_out16, qkv_lse, dout, scale, dqkv_kept,
                                          documents);
    expect_same_bits(dqkv_kept, dqkv, "qkv_attention_backward dqkv" + where);
    // dqkv written in bf16 for the projection's GEMMs: its rounding.
    Tensor dqkv16 = Tensor::full(qkv16.shape(), NAN, DType::BF16);
    cuda_emulated::qkv_attention_backward(qkv16, Hq, Hkv, 10000.0, 3, qkv_out16, qkv_lse, dout, scale, dqkv16,
                                          documents);
    expect_same_bits(dqkv16, dqkv.to(DType::BF16), "qkv_attention_backward dqkv in bf16" + where);
  }
}

// ---- moe.cu, moe_stats.cu ------------------------------------------------------------------------

// ids [N, k] i32 that crowd the first experts (skewed, with empty experts), distinct within a row.
Tensor skewed_expert_ids(int64_t N, int64_t k, int64_t E) {
  std::vector<int32_t> ids(static_cast<size_t>(N * k));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j)
      ids[static_cast<size_t>(n * k + j)] = static_cast<int32_t>((n % 3 == 0 ? j : (n * 7 + j * 5)) % E);
  for (int64_t n = 0; n < N; ++n)  // make each row's experts distinct
    for (int64_t j = 1; j < k; ++j)
      for (int64_t i = 0; i < j; ++i)
        if (ids[static_cast<size_t>(n * k + j)] == ids[static_cast<size_t>(n * k + i)]) {
          ids[static_cast<size_t>(n * k + j)] = static_cast<int32_t>((ids[static_cast<size_t>(n * k + j)] + 1) % E);
          i = -1;
        }
  return Tensor::from_vector<int32_t>({N, k}, ids);
}

// The router's rows run the CPU's own code (tensor/moe_rows.h): bit for bit, renormalised or not,
// with more rows than a block and more experts than k. The combine adds in the CPU's order (bit for
// bit); its backward, with the experts' SwiGLU, agrees to rounding.
TEST(CudaEmulation, RouterAndCombineMatchTheCpuKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [N, E, k] :
         std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {7, 8, 2}, {300, 16, 4}, {5, 64, 6}})
      for (bool renormalize : {false, true}) {
        const std::string where = std::string(dtype_name(dtype)) + " N " + std::to_string(N) + " E " +
                                  std::to_string(E) + " k " + std::to_string(k) + (renormalize ? " renormalised" : "");
        const Tensor logits = test::random_tensor({N, E}, 131, dtype, 3.0);
        Tensor probs = Tensor::empty({N, E}, dtype), lse = Tensor::empty({N}, dtype);
        Tensor weights = Tensor::empty({N, k}, dtype), ids = Tensor::empty({N, k}, DType::I32);
        Tensor probs_e = Tensor::full({N, E}, NAN, dtype), lse_e = Tensor::full({N}, NAN, dtype);
        Tensor weights_e = Tensor::full({N, k}, NAN, dtype), ids_e = Tensor::full({N, k}, -1.0, DType::I32);
        kernels::router_topk(logits, k, renormalize, probs, lse, weights, ids);
        cuda_emulated::router_topk(logits, k, renormalize, probs_e, lse_e, weights_e, ids_e);
        expect_same_bits(probs_e, probs, "probs " + where);
        expect_same_bits(lse_e, lse, "lse " + where);
        expect_same_bits(weights_e, weights, "weights " + where);
        expect_same_bits(ids_e, ids, "ids " + where);

        const Tensor dweights = test::random_tensor({N, k}, 132, dtype);
        Tensor dlogits = Tensor::empty({N, E}, dtype), dlogits_e = Tensor::full({N, E}, NAN, dtype);
        kernels::router_topk_backward(probs, ids, renormalize, dweights, 0.5, dlogits);
        cuda_emulated::router_topk_backward(probs, ids, renormalize, dweights, 0.5, dlogits_e);
        expect_same_bits(dlogits_e, dlogits, "router_topk_backward " + where);

        const Tensor counts = test::random_tensor({E}, 133, dtype, 10.0), upstream = Tensor::full({1}, 0.3, dtype);
        kernels::router_aux_backward(probs, lse, counts, upstream, 0.01, 0.001, dlogits);
        cuda_emulated::router_aux_backward(probs, lse, counts, upstream, 0.01, 0.001, dlogits_e);
        expect_same_bits(dlogits_e, dlogits, "router_aux_backward " + where);

        // The combine over the experts' rows in dispatch order (positions a permutation of [0, N k)).
        const int64_t C = 37, M = N * k;
        std::vector<int32_t> position(static_cast<size_t>(M));
        for (int64_t a = 0; a < M; ++a) position[static_cast<size_t>(a)] = static_cast<int32_t>((a * 7 + 3) % M);
        if (M % 7 == 0) std::iota(position.rbegin(), position.rend(), 0);  // 7 shares a factor with M: reversed
        const Tensor pos = Tensor::from_vector<int32_t>({M}, position);
        const Tensor y = test::random_tensor({M, C}, 134, dtype);
        Tensor out = Tensor::empty({N, C}, dtype), out_e = Tensor::full({N, C}, NAN, dtype);
        kernels::combine_rows(y, weights, pos, out);
        cuda_emulated::combine_rows(y, weights, pos, out_e, false);
        expect_same_bits(out_e, out, "combine_rows " + where);
        const Tensor before = test::random_tensor({N, C}, 139, dtype);
        Tensor added = before.clone(), added_e = before.clone();
        kernels::combine_rows(y, weights, pos, added, 1.0);
        cuda_emulated::combine_rows(y, weights, pos, added_e, true);
        expect_same_bits(added_e, added, "combine_rows added to out " + where);
        // Its backward with the experts' SwiGLU, for up to 64 rows (each is a block of 256 fibers): rows
        // shorter and longer than the block. The exponentials may differ in the last bit, and the block
        // sums dw in f64 where the CPU sums vector lanes.
        if (renormalize || M > 64) continue;
        for (const int64_t width : {C, int64_t{300}}) {
          const std::string at = where + " width " + std::to_string(width);
          const double tolerance = dtype == DType::F32 ? 1e-5 : 1e-13;
          Tensor gate = Tensor::empty({M, width}, dtype);
          kernels::scale(test::random_tensor({M, width}, 135, dtype), 6.0, gate);  // saturating too
          const Tensor gate_up = test::side_by_side(gate, test::random_tensor({M, width}, 136, dtype));
          const Tensor t = test::random_tensor({M, width}, 137, dtype);
          auto fresh = [&](const Shape& shape) { return Tensor::full(shape, NAN, dtype); };
          Tensor h = fresh({M, width}), h_e = fresh({M, width});
          Tensor dgate_up = fresh({M, 2 * width}), dgate_up_e = fresh({M, 2 * width});
          Tensor dw = fresh({N, k}), dw_e = fresh({N, k});
          kernels::swiglu_combine_backward(weights, pos, gate_up, t, h, dgate_up, dw);
          cuda_emulated::swiglu_combine_backward(weights, pos, gate_up, t, h_e, dgate_up_e, dw_e);
          test::expect_close(values(dgate_up_e), values(dgate_up), tolerance, tolerance,
                             "swiglu_combine_backward dgate_up " + at);
          test::expect_close(values(h_e), values(h), tolerance, tolerance, "swiglu_combine_backward h " + at);
          test::expect_close(values(dw_e), values(dw), tolerance, tolerance, "swiglu_combine_backward dw " + at);
        }
      }
}

// The emulated dispatch of skewed ids (skewed_expert_ids) against the CPU kernel's, bit for bit.
void expect_dispatch_matches_the_cpu(int64_t N, int64_t k, int64_t E, const std::string& where) {
  const Tensor ids = skewed_expert_ids(N, k, E);
  Tensor token = Tensor::empty({N * k}, DType::I32), position = Tensor::empty({N * k}, DType::I32);
  Tensor offsets = Tensor::empty({E + 1}, DType::I64);
  Tensor token_e = Tensor::full({N * k}, -1.0, DType::I32), position_e = Tensor::full({N * k}, -1.0, DType::I32);
  Tensor offsets_e = Tensor::full({E + 1}, -1.0, DType::I64);
  kernels::dispatch_plan(ids, token, position, offsets);
  cuda_emulated::dispatch_plan(ids, token_e, position_e, offsets_e);
  expect_same_bits(token_e, token, "token_of " + where);
  expect_same_bits(position_e, position, "position_of " + where);
  expect_same_bits(offsets_e, offsets, "offsets " + where);
}

// The dispatch's chunked counting sort lands every assignment where the CPU's sequential sort does,
// over more assignments than a chunk (256) and with empty experts; the statistics agree to f64 rounding.
TEST(CudaEmulation, DispatchAndRoutingStatisticsMatchTheCpuKernels) {
  for (const auto& [N, E, k] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {9, 8, 2}, {700, 16, 3}, {130, 64, 6}}) {
    const std::string where = "N " + std::to_string(N) + " E " + std::to_string(E) + " k " + std::to_string(k);
    expect_dispatch_matches_the_cpu(N, k, E, where);
    const Tensor ids = skewed_expert_ids(N, k, E);

    for (DType dtype : {DType::F32, DType::F64}) {
      const std::string typed = std::string(dtype_name(dtype)) + " " + where;
      const Tensor logits = test::random_tensor({N, E}, 141, dtype, 2.0);
      Tensor probs = Tensor::empty({N, E}, dtype), lse = Tensor::empty({N}, dtype);
      Tensor weights = Tensor::empty({N, k}, dtype), chosen = Tensor::empty({N, k}, DType::I32);
      kernels::router_topk(logits, k, true, probs, lse, weights, chosen);
      auto f64 = [] { return Tensor::full({1}, NAN, DType::F64); };
      Tensor counts = Tensor::empty({E}, dtype), balance = f64(), z = f64(), aux = Tensor::empty({1}, dtype);
      Tensor counts_e = Tensor::full({E}, NAN, dtype), balance_e = f64(), z_e = f64(), aux_e = Tensor::empty({1}, dtype);
      kernels::router_aux_loss(probs, lse, ids, 0.01, 0.001, counts, balance, z, aux);
      cuda_emulated::router_aux_loss(probs, lse, ids, 0.01, 0.001, counts_e, balance_e, z_e, aux_e);
      expect_same_bits(counts_e, counts, "counts " + typed);
      test::expect_close(values(balance_e), values(balance), 1e-13, 0.0, "balance " + typed);
      test::expect_close(values(z_e), values(z), 1e-13, 0.0, "z " + typed);
      test::expect_close(values(aux_e), values(aux), dtype == DType::F32 ? 1e-7 : 1e-13, 0.0, "aux " + typed);
      Tensor entropy = f64(), max_logit = f64(), entropy_e = f64(), max_logit_e = f64();
      kernels::routing_entropy(probs, logits, lse, entropy, max_logit);
      cuda_emulated::routing_entropy(probs, logits, lse, entropy_e, max_logit_e);
      test::expect_close(values(entropy_e), values(entropy), 1e-12, 1e-14, "entropy " + typed);
      expect_same_bits(max_logit_e, max_logit, "max_logit " + typed);

      // Warmup statistics: the observations of a step's two forwards, folded into a first observation,
      // then into a moving average; the noise from them.
      Tensor stats = Tensor::zeros({3}, DType::F64), stats_e = Tensor::zeros({3}, DType::F64);
      Tensor observations = Tensor::zeros({3}, DType::F64), observations_e = Tensor::zeros({3}, DType::F64);
      for (uint64_t round = 0; round < 2; ++round) {
        for (uint64_t forward = 0; forward < 2; ++forward) {
          const Tensor observed = test::random_tensor({N, E}, 142 + 2 * round + forward, dtype, 3.0);
          kernels::routing_warmup_observe(observed, stats, observations);
          cuda_emulated::routing_warmup_observe(observed, stats_e, observations_e);
          test::expect_close(values(observations_e), values(observations), 1e-12, 1e-12, "warmup sums " + typed);
        }
        kernels::routing_warmup_fold(observations, 0.9, stats);
        cuda_emulated::routing_warmup_fold(observations_e, 0.9, stats_e);
        test::expect_close(values(stats_e), values(stats), 1e-13, 1e-15, "warmup stats " + typed);
        expect_same_bits(observations_e, observations, "warmup observations zeroed " + typed);
      }
      const Tensor eps = test::random_tensor({N, E}, 144, DType::F64);
      Tensor noise = Tensor::empty({N, E}, dtype), noise_e = Tensor::full({N, E}, NAN, dtype);
      kernels::routing_warmup_noise(stats, eps, 0.25, noise);
      cuda_emulated::routing_warmup_noise(stats, eps, 0.25, noise_e);
      expect_same_bits(noise_e, noise, "warmup noise " + typed);
      Tensor total = test::random_tensor({N, E}, 145, DType::F64), total_e = total.clone();
      kernels::accumulate_f64(logits, total);
      cuda_emulated::accumulate_f64(logits, total_e);
      expect_same_bits(total_e, total, "accumulate_f64 " + typed);
    }
  }
}

// More chunks of assignments than one counting block has threads (1,024 chunks of 256): the last block
// adds up the other block's counts before it places every chunk.
TEST(CudaEmulation, DispatchOverSeveralCountingBlocksMatchesTheCpuKernel) {
  const int64_t N = 131200, k = 2, E = 16;  // 1,025 chunks
  expect_dispatch_matches_the_cpu(N, k, E, "over 1,025 chunks");
}

// The router in one call (two launches, the counts taken per block of rows) gives the bits of its two
// unfused calls, over rows of several blocks and none; against the CPU, the sums agree to f64 rounding.
TEST(CudaEmulation, RouterTopKWithAuxLossMatchesTheUnfusedKernels) {
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [N, E, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {0, 4, 2}, {1, 1, 1}, {9, 8, 2}, {700, 16, 3}, {130, 64, 6}}) {
      const std::string where = std::string(dtype_name(dtype)) + " N " + std::to_string(N) + " E " +
                                std::to_string(E) + " k " + std::to_string(k);
      const Tensor logits = test::random_tensor({N, E}, 171, dtype, 3.0);
      struct Routing {
        Tensor probs, lse, weights, ids, counts, balance, z, aux;
      };
      auto fresh = [&] {
        auto f64 = [] { return Tensor::full({1}, NAN, DType::F64); };
        return Routing{Tensor::full({N, E}, NAN, dtype), Tensor::full({N}, NAN, dtype),
                       Tensor::full({N, k}, NAN, dtype), Tensor::full({N, k}, -1.0, DType::I32),
                       Tensor::full({E}, NAN, dtype),    f64(),
                       f64(),                            Tensor::full({1}, NAN, dtype)};
      };
      Routing cpu = fresh(), fused = fresh(), unfused = fresh();
      kernels::router_topk_with_aux_loss(logits, k, true, 0.01, 0.001, cpu.probs, cpu.lse, cpu.weights, cpu.ids,
                                         cpu.counts, cpu.balance, cpu.z, cpu.aux);
      cuda_emulated::router_topk_with_aux_loss(logits, k, true, 0.01, 0.001, fused.probs, fused.lse, fused.weights,
                                               fused.ids, fused.counts, fused.balance, fused.z, fused.aux);
      cuda_emulated::router_topk(logits, k, true, unfused.probs, unfused.lse, unfused.weights, unfused.ids);
      cuda_emulated::router_aux_loss(unfused.probs, unfused.lse, unfused.ids, 0.01, 0.001, unfused.counts,
                                     unfused.balance, unfused.z, unfused.aux);
      for (const auto& [what, got, unfused_bits, on_cpu] :
           std::vector<std::tuple<std::string, Tensor, Tensor, Tensor>>{
               {"probs", fused.probs, unfused.probs, cpu.probs},
               {"lse", fused.lse, unfused.lse, cpu.lse},
               {"weights", fused.weights, unfused.weights, cpu.weights},
               {"ids", fused.ids, unfused.ids, cpu.ids},
               {"counts", fused.counts, unfused.counts, cpu.counts},
               {"balance", fused.balance, unfused.balance, cpu.balance},
               {"z", fused.z, unfused.z, cpu.z},
               {"aux", fused.aux, unfused.aux, cpu.aux}}) {
        expect_same_bits(got, unfused_bits, what + " against the unfused kernels " + where);
        if (what == "balance" || what == "z" || what == "aux")
          test::expect_close(values(got), values(on_cpu), dtype == DType::F32 && what == "aux" ? 1e-7 : 1e-13, 0.0,
                             what + " against the CPU " + where);
        else
          expect_same_bits(got, on_cpu, what + " against the CPU " + where);
      }
    }
}

// ---- attention_decode.cu, dpo.cu ---------------------------------------------------------------

// Queries at the end of partly filled caches, rows of different lengths, GQA, more keys than the block's
// threads.
TEST(CudaEmulation, AttentionDecodeMatchesTheCpuKernel) {
  struct Case {
    int64_t Tq, capacity, Hq, Hkv, D;
    std::vector<int64_t> Tk_B;
  };
  for (DType dtype : {DType::F32, DType::F64})
    for (const Case& c : std::vector<Case>{{1, 1, 1, 1, 4, {1}},
                                           {1, 40, 4, 2, 8, {37, 40}},
                                           {2, 50, 2, 1, 37, {50, 9}},
                                           {1, 40, 4, 2, 8, {3, 40, 1, 22}},
                                           {3, 300, 2, 1, 16, {300}}}) {
      const int64_t B = static_cast<int64_t>(c.Tk_B.size());
      const double tolerance = dtype == DType::F32 ? 1e-6 : 1e-13;
      const Tensor q = test::random_tensor({B, c.Tq, c.Hq, c.D}, 151, dtype);
      const Tensor k = test::random_tensor({B, c.capacity, c.Hkv, c.D}, 152, dtype);
      const Tensor v = test::random_tensor({B, c.capacity, c.Hkv, c.D}, 153, dtype);
      Tensor out = Tensor::empty(q.shape(), dtype), out_e = Tensor::full(q.shape(), NAN, dtype);
      kernels::attention_decode(q, k, v, c.Tk_B, 0.25, out);
      cuda_emulated::attention_decode(q, k, v, c.Tk_B, 0.25, out_e);
      test::expect_close(values(out_e), values(out), tolerance, tolerance,
                         "attention_decode " + std::string(dtype_name(dtype)) + " B " + std::to_string(B) +
                             " capacity " + std::to_string(c.capacity));
    }
}

// Pairs packed into rows with prompts (-1) between them, responses not contiguous, a format-only mask
// (counted), and no pairs at all.
TEST(CudaEmulation, DpoLossMatchesTheCpuKernel) {
  for (DType dtype : {DType::F32, DType::F64})
    for (int64_t P : {int64_t{0}, int64_t{1}, int64_t{3}}) {
      const int64_t N = 40;
      std::vector<int32_t> response(static_cast<size_t>(N)), counted(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        response[static_cast<size_t>(n)] = P == 0 || n % 5 == 0 ? -1 : static_cast<int32_t>((n * 3) % (2 * P));
        counted[static_cast<size_t>(n)] = n % 7 != 3;
      }
      std::vector<double> reference(static_cast<size_t>(2 * P));
      for (int64_t j = 0; j < 2 * P; ++j) reference[static_cast<size_t>(j)] = -3.0 - 0.7 * static_cast<double>(j);
      const Tensor token_logp = test::random_tensor({N}, 161, dtype, 0.5);
      const Tensor ids = Tensor::from_vector<int32_t>({N}, response), mask = Tensor::from_vector<int32_t>({N}, counted);
      const Tensor ref = Tensor::from_vector<double>({2 * P}, reference);
      Tensor loss = Tensor::empty({1}, dtype), stats = Tensor::empty({kernels::kDpoStats}, DType::F64);
      Tensor dx = Tensor::empty({N}, dtype);
      Tensor loss_e = Tensor::full({1}, NAN, dtype), stats_e = Tensor::full({kernels::kDpoStats}, NAN, DType::F64);
      Tensor dx_e = Tensor::full({N}, NAN, dtype);
      kernels::dpo_loss(token_logp, ids, mask, ref, 0.1, 0.05, loss, stats, dx);
      cuda_emulated::dpo_loss(token_logp, ids, mask, ref, 0.1, 0.05, loss_e, stats_e, dx_e);
      const std::string where = std::string(dtype_name(dtype)) + " P " + std::to_string(P);
      expect_same_bits(loss_e, loss, "loss " + where);
      expect_same_bits(stats_e, stats, "stats " + where);
      expect_same_bits(dx_e, dx, "dtoken_logp " + where);
    }
}

}  // namespace
}  // namespace lt
