// Forward checks of the elementwise, reduction and GEMM kernels against plain scalar loops, on every
// Highway target of this machine.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <functional>
#include <string>

#include "tensor/cpu/amx.h"
#include "tensor/cpu/bf16_dot.h"
#include "tensor/cpu/kernels.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"
#include "tests/test_util.h"

namespace lt {
namespace {

using test::expect_close;
using test::for_each_cpu_target;
using test::random_tensor;

template <class T>
void check_binary(DType dtype) {
  for (const auto& [a_shape, b_shape] : std::vector<std::pair<Shape, Shape>>{
           {{1}, {1}}, {{3, 17}, {17}}, {{129}, {129}}, {{5, 3, 129}, {3, 129}}, {{2, 1000}, {1000}}}) {
    const Tensor a = random_tensor(a_shape, 1, dtype), b = random_tensor(b_shape, 2, dtype);
    const std::vector<T> av = a.to_vector<T>(), bv = b.to_vector<T>();
    const size_t inner = bv.size();
    std::vector<T> want_add(av.size()), want_sub(av.size()), want_mul(av.size());
    for (size_t i = 0; i < av.size(); ++i) {
      want_add[i] = av[i] + bv[i % inner];
      want_sub[i] = av[i] - bv[i % inner];
      want_mul[i] = av[i] * bv[i % inner];
    }
    Tensor out = Tensor::empty_like(a);
    kernels::add(a, b, out);
    expect_close(out.to_vector<T>(), want_add, 0, 0, "add " + shape_str(a_shape));
    kernels::sub(a, b, out);
    expect_close(out.to_vector<T>(), want_sub, 0, 0, "sub " + shape_str(a_shape));
    kernels::mul(a, b, out);
    expect_close(out.to_vector<T>(), want_mul, 0, 0, "mul " + shape_str(a_shape));

    Tensor reduced = Tensor::empty(b_shape, dtype);
    kernels::sum_to(a, reduced);
    std::vector<T> want_reduced(inner, T(0));
    for (size_t i = 0; i < av.size(); ++i) want_reduced[i % inner] += av[i];
    expect_close(reduced.to_vector<T>(), want_reduced, 1e-6, 1e-6, "sum_to " + shape_str(a_shape));
  }
}

TEST(ElementwiseKernels, MatchScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_binary<float>(DType::F32);
    check_binary<double>(DType::F64);
  });
}

TEST(ElementwiseKernels, ScaleAndAxpy) {
  for_each_cpu_target([] {
    const Tensor x = random_tensor({3, 129}, 3), y0 = random_tensor({3, 129}, 4);
    const std::vector<float> xv = x.to_vector<float>(), yv = y0.to_vector<float>();
    Tensor y = y0.clone(), s = Tensor::empty_like(x);
    kernels::axpy(0.5, x, y);
    kernels::scale(x, -2.0, s);
    std::vector<float> want_y(xv.size()), want_s(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      want_y[i] = 0.5f * xv[i] + yv[i];
      want_s[i] = -2.0f * xv[i];
    }
    expect_close(y.to_vector<float>(), want_y, 1e-6);
    expect_close(s.to_vector<float>(), want_s, 0);
  });
}

TEST(ReduceKernels, SumAndSumLastDim) {
  for_each_cpu_target([] {
    for (int64_t n : {1, 3, 17, 129, 100000}) {
      const Tensor x = random_tensor({n}, 5, DType::F64);
      double want = 0;
      for (double v : x.to_vector<double>()) want += v;
      Tensor out = Tensor::empty({1}, DType::F64);
      kernels::sum(x, out);
      EXPECT_NEAR(out.item(), want, 1e-9 * std::max(1.0, std::fabs(want))) << "n=" << n;
    }
    const Tensor x = random_tensor({17, 129}, 6);
    Tensor out = Tensor::empty({17});
    kernels::sum_last_dim(x, out);
    const std::vector<float> xv = x.to_vector<float>();
    std::vector<float> want(17, 0.f);
    for (int r = 0; r < 17; ++r)
      for (int c = 0; c < 129; ++c) want[r] += xv[r * 129 + c];
    expect_close(out.to_vector<float>(), want, 1e-5, 1e-5);
  });
}

// Reference: c = alpha * op(a) op(b) + beta * c, one batch.
template <class T>
std::vector<T> reference_gemm(const std::vector<T>& a, bool ta, const std::vector<T>& b, bool tb, const std::vector<T>& c0,
                              int64_t M, int64_t N, int64_t K, double alpha, double beta) {
  std::vector<T> c(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(ta ? a[k * M + i] : a[i * K + k]) * double(tb ? b[j * K + k] : b[k * N + j]);
      c[i * N + j] = T(alpha * acc + (beta == 0 ? 0.0 : beta * double(c0[i * N + j])));
    }
  return c;
}

TEST(GemmKernel, EveryTransposeAndTailMatchesScalarLoops) {
  for_each_cpu_target([] {
    for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 17, 129}, {17, 129, 3}, {129, 33, 64}, {5, 64, 1}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (double beta : {0.0, 0.5}) {
            const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 7);
            const Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 8);
            Tensor c = random_tensor({M, N}, 9);
            const std::vector<float> c0 = c.to_vector<float>();
            kernels::matmul(a, ta, b, tb, c, 1.5, beta);
            const auto want = reference_gemm(a.to_vector<float>(), ta, b.to_vector<float>(), tb, c0, M, N, K, 1.5, beta);
            expect_close(c.to_vector<float>(), want, 1e-4, 1e-4,
                         "gemm M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                             (ta ? " Ta" : "") + (tb ? " Tb" : ""));
          }
  });
}

// One GEMM of every transpose variant against the reference, f32 or f64, tolerance scaled with K (the
// reference sums in double; an f32 sum of K products of unit normals is off by ~sqrt(K) ulps of ~sqrt(K)).
template <class T>
void check_gemm_shape(int64_t M, int64_t N, int64_t K, DType dtype, double beta) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 7, dtype);
      const Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 8, dtype);
      Tensor c = random_tensor({M, N}, 9, dtype);
      const std::vector<T> c0 = c.to_vector<T>();
      kernels::matmul(a, ta, b, tb, c, 1.5, beta);
      const auto want = reference_gemm(a.to_vector<T>(), ta, b.to_vector<T>(), tb, c0, M, N, K, 1.5, beta);
      const double tol = (dtype == DType::F32 ? 2e-6 : 1e-14) * static_cast<double>(K + 16);
      expect_close(c.to_vector<T>(), want, tol, tol,
                   "gemm M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                       (ta ? " Ta" : "") + (tb ? " Tb" : "") + " beta=" + std::to_string(beta));
    }
}

// Shapes just below, at and above the blocking boundaries of tensor/cpu/gemm.cc, on every target (whose
// vector and tile widths differ): tile rows (6) and two tiles (the largest M of the dot-product path
// against a transposed b, and of reading b in place), tile columns (2 or 4 vectors: 2 to 64 floats),
// the Lanes x Lanes blocks of the packing transposes (4, 8, 16 k's), KC (256 floats, 128 doubles), NC
// (1024 floats; 512 on an L2 of 512 KiB) and MC (2048 rows); the narrow shares that read op(a) in place
// (256 columns) and b [K, N] too (up to 512 rows), with partial last A panels; a transposed a whose k's
// lie a page apart (M = 1024 floats) or more (1025; 2047 and 2049 rows; 600 doubles), packed 512 rows at
// a time; and K = 0, where C = beta C.
TEST(GemmKernel, BlockingBoundariesMatchScalarLoops) {
  const std::vector<std::array<int64_t, 3>> shapes = {
      {5, 63, 7},    {6, 64, 8},    {7, 65, 9},   {11, 17, 33},   {12, 130, 40},   {13, 129, 31},  {25, 31, 255},
      {19, 33, 256}, {30, 66, 257}, {8, 20, 513}, {3, 1023, 17},  {14, 1025, 12},  {9, 2049, 5},   {2047, 9, 10},
      {2049, 70, 9}, {1, 200, 300}, {4, 5, 1},    {40, 1, 70},    {511, 256, 33},  {512, 257, 20}, {513, 250, 17},
      {20, 70, 0},   {3, 9, 0},     {15, 513, 9}, {1024, 40, 20}, {1025, 256, 30},
  };
  for_each_cpu_target([&] {
    for (const auto& [M, N, K] : shapes) check_gemm_shape<float>(M, N, K, DType::F32, 0.5);
    for (const auto& [M, N, K] : {std::array<int64_t, 3>{13, 70, 129}, {7, 33, 300}, {2, 17, 257}, {600, 40, 20}})
      check_gemm_shape<double>(M, N, K, DType::F64, 0.0);
  });
}

// NC follows the L2 read at start-up: the packed B block, KC = 256 floats deep, fits in it, from 256 up to
// 1024 f32 columns. The column blocks change no bits (only KC splits the sum over k).
TEST(GemmKernel, ColumnBlockFitsTheL2) {
  EXPECT_EQ(cpu::gemm_column_block_bytes(int64_t{512} << 10), 512 * 4);  // Zen 3
  EXPECT_EQ(cpu::gemm_column_block_bytes(int64_t{1} << 20), 1024 * 4);   // Zen 4
  EXPECT_EQ(cpu::gemm_column_block_bytes(int64_t{2} << 20), 1024 * 4);   // Sapphire Rapids: at most 1024
  EXPECT_EQ(cpu::gemm_column_block_bytes(int64_t{128} << 10), 256 * 4);  // at least 256
  const int64_t l2 = cpu_l2_cache_bytes();
  EXPECT_GE(l2, int64_t{64} << 10);
  EXPECT_LE(l2, int64_t{64} << 20);
}

// Every element of C is computed the same way whichever thread computes it (one FMA chain over k per KC
// block on the panel path, one dot product on the dot-product path), so 1, 2 and 3 threads (an uneven
// split) give bit-identical results: panel path split along N and along M, and the dot-product path
// (every shape here is large enough to be split).
TEST(GemmKernel, ThreadCountDoesNotChangeTheBits) {
  const int original_threads = num_threads();
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{
           {300, 700, 300}, {900, 130, 520}, {7, 5000, 300}, {64, 1000, 256}, {2049, 64, 100}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 11);
        const Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 12);
        const Tensor c0 = random_tensor({M, N}, 13);
        std::vector<Tensor> results;
        for (int threads : {1, 2, 3}) {
          set_num_threads(threads);
          Tensor c = c0.clone();
          kernels::matmul(a, ta, b, tb, c, 0.75, 0.5);
          results.push_back(c);
        }
        for (size_t i = 1; i < results.size(); ++i)
          EXPECT_EQ(std::memcmp(results[0].raw_data(), results[i].raw_data(), results[0].nbytes()), 0)
              << "M=" << M << " N=" << N << " K=" << K << (ta ? " Ta" : "") << (tb ? " Tb" : "") << ": "
              << (i + 1) << " threads differ from 1";
      }
  set_num_threads(original_threads);
}

// matmul_add: the addend joins each element of the finished product, so the result has the bits of
// matmul followed by add (addend + product), on every path the GEMM takes: the dot products of a few
// rows against a transposed b, few columns computed transposed, the panels with one and with several
// KC blocks (K = 600: the addend after the last), partial edge tiles, K = 0, batched a against a shared
// and a batched b, f64, and 1 and 2 threads. c starts as NaN: an element the GEMM never writes fails.
TEST(GemmKernel, MatmulAddHasTheBitsOfMatmulThenAdd) {
  struct Case {
    int64_t G, M, N, K;
    bool b_batched;
  };
  const std::vector<Case> cases = {{0, 5, 70, 33, false},   {0, 300, 20, 70, false}, {0, 64, 129, 600, false},
                                   {0, 13, 65, 257, false}, {0, 7, 3, 0, false},     {3, 17, 40, 129, false},
                                   {2, 30, 70, 20, true},   {0, 130, 300, 40, false}};
  const int original_threads = num_threads();
  for_each_cpu_target([&] {
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (const DType dtype : {DType::F32, DType::F64})
        for (const Case& s : cases)
          for (bool ta : {false, true})
            for (bool tb : {false, true}) {
              if (s.G > 0 && !s.b_batched && ta) continue;  // a batched a against a shared b is not transposed
              Shape a_shape = ta ? Shape{s.K, s.M} : Shape{s.M, s.K}, b_shape = tb ? Shape{s.N, s.K} : Shape{s.K, s.N};
              Shape c_shape{s.M, s.N};
              if (s.G > 0) {
                a_shape.insert(a_shape.begin(), s.G);
                c_shape.insert(c_shape.begin(), s.G);
                if (s.b_batched) b_shape.insert(b_shape.begin(), s.G);
              }
              const Tensor a = random_tensor(a_shape, 31, dtype), b = random_tensor(b_shape, 32, dtype);
              const Tensor addend = random_tensor(c_shape, 33, dtype);
              Tensor product = Tensor::empty(c_shape, dtype), want = Tensor::empty(c_shape, dtype);
              kernels::matmul(a, ta, b, tb, product);
              kernels::add(addend, product, want);
              Tensor c = Tensor::full(c_shape, std::nan(""), dtype);
              kernels::matmul_add(a, ta, b, tb, addend, c);
              EXPECT_EQ(std::memcmp(c.raw_data(), want.raw_data(), c.nbytes()), 0)
                  << dtype_name(dtype) << " G=" << s.G << " M=" << s.M << " N=" << s.N << " K=" << s.K
                  << (ta ? " Ta" : "") << (tb ? " Tb" : "") << ", " << threads << " threads";
            }
    }
  });
  set_num_threads(original_threads);
}

// In bf16 (the pairs and, where the CPU has them, the AMX tiles) too: the addend joins the f32 result.
TEST(GemmKernel, MatmulAddInBf16HasTheBitsOfMatmulThenAdd) {
  if (!kernels::cpu_has_bf16_matmul()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{40, 70, 600}, {100, 129, 33}, {13, 64, 256}}) {
    const Tensor a = random_tensor({M, K}, 41), b = random_tensor({N, K}, 42), addend = random_tensor({M, N}, 43);
    Tensor product = Tensor::empty({M, N}), want = Tensor::empty({M, N}), c = Tensor::empty({M, N});
    kernels::matmul(a, false, b, true, product);
    kernels::add(addend, product, want);
    kernels::matmul_add(a, false, b, true, addend, c);
    EXPECT_EQ(std::memcmp(c.raw_data(), want.raw_data(), c.nbytes()), 0) << "M=" << M << " N=" << N << " K=" << K;
  }
  kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
}

TEST(GemmKernel, MatmulAddRejectsBadArguments) {
  const Tensor a = random_tensor({5, 3}, 1), b = random_tensor({3, 7}, 2);
  Tensor c = Tensor::empty({5, 7});
  const auto message = [&](const Tensor& addend, Tensor& out) {
    try {
      kernels::matmul_add(a, false, b, false, addend, out);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(random_tensor({5, 8}, 3), c).find("matmul_add: addend"), std::string::npos);
  EXPECT_NE(message(random_tensor({5, 7}, 3, DType::F64), c).find("matmul_add: addend"), std::string::npos);
  EXPECT_NE(message(c, c).find("matmul_add"), std::string::npos);
  Tensor wrong = Tensor::empty({5, 6});
  EXPECT_NE(message(random_tensor({5, 6}, 3), wrong).find("matmul_add: c"), std::string::npos);
}

std::vector<float> rounded_to_bf16(const Tensor& x) { return x.to(DType::BF16).to(DType::F32).to_vector<float>(); }

// The first n columns of a 2-D f32 tensor, as a new tensor.
Tensor first_columns(const Tensor& x, int64_t n) {
  const std::vector<float> all = x.to_vector<float>();
  std::vector<float> part;
  for (int64_t r = 0; r < x.dim(0); ++r)
    part.insert(part.end(), all.begin() + r * x.dim(1), all.begin() + r * x.dim(1) + n);
  return Tensor::from_vector<float>({x.dim(0), n}, part);
}

// A C of few columns (the router's 16 or 32 experts) is computed as its transpose on AVX-512, whose tile
// is 64 floats wide (tensor/cpu/gemm.cc, FewColumnsGoTransposed). Each element must keep the bits of
// the panel path, which a product of 64 columns takes: its first N columns, against the same first N
// columns of b, are the narrow product bit for bit. Every transpose variant, beta reading C, one and two
// KC blocks, the edges of the rule (13 and 48 columns go transposed, 49 do not), f32 and bf16 inputs, on
// every target.
TEST(GemmKernel, FewColumnsKeepThePanelPathsBits) {
  test::for_each_bf16_tile_unit([](const char* unit) {
    for_each_cpu_target([unit] {
      for (const bool bf16 : {false, true}) {
        if (!bf16 && cpu::amx_tiles() != cpu::AmxTiles::Off) continue;  // f32 has no tile unit: checked once
        const test::MatmulPrecisionScope precision(bf16 ? kernels::MatmulPrecision::BF16Inputs
                                                  : kernels::MatmulPrecision::F32);
        for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{
                 {1024, 16, 256}, {300, 33, 300}, {200, 13, 40}, {130, 48, 20}, {130, 49, 20}})
          for (bool ta : {false, true})
            for (bool tb : {false, true}) {
              const int64_t wide = 64;
              const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 31);
              const Tensor b_wide = random_tensor(tb ? Shape{wide, K} : Shape{K, wide}, 32);
              const Tensor c0_wide = random_tensor({M, wide}, 33);
              const Tensor b = tb ? b_wide.narrow(0, N).clone() : first_columns(b_wide, N);
              Tensor c = first_columns(c0_wide, N), c_wide = c0_wide.clone();
              kernels::matmul(a, ta, b, tb, c, 1.5, 0.5);
              kernels::matmul(a, ta, b_wide, tb, c_wide, 1.5, 0.5);
              const Tensor narrow_part = first_columns(c_wide, N);
              EXPECT_EQ(std::memcmp(c.raw_data(), narrow_part.raw_data(), c.nbytes()), 0)
                  << (bf16 ? unit : "f32") << " M=" << M << " N=" << N << " K=" << K << (ta ? " Ta" : "")
                  << (tb ? " Tb" : "");
            }
      }
    });
  });
}

// --dtype bf16 on the CPU: on a target with the bf16 GEMM (AVX-512 on a CPU with AVX512_BF16) every
// GEMM of more than 12 rows is the product of the operands rounded to bf16, summed in f32; the few-row
// paths, and every GEMM on other targets or CPUs, stay exact f32. Shapes around the bf16 blocking: odd K
// (a pair padded with zero), KC (512 k's), several KC blocks, partial tiles, M just above the few-row
// paths, MC (2048 rows), NC (1024 columns) and K = 0.
TEST(GemmKernel, Bf16InputsMultiplyTheRoundedOperands) {
  const test::MatmulPrecisionScope bf16(kernels::MatmulPrecision::BF16Inputs);
  const std::vector<std::array<int64_t, 3>> shapes = {{13, 64, 1},   {13, 65, 3},     {30, 17, 511}, {19, 130, 512},
                                                      {25, 70, 513}, {40, 33, 1100},  {7, 200, 300}, {12, 129, 64},
                                                      {2049, 9, 34}, {14, 1100, 40},  {20, 70, 0}};
  int bf16_targets = 0;
  test::for_each_bf16_tile_unit([&](const char* unit) {
    for_each_cpu_target([&] {
      const bool bf16_gemm = kernels::cpu_has_bf16_matmul();
      bf16_targets += bf16_gemm;
      for (const auto& [M, N, K] : shapes)
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 21);
            const Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 22);
            Tensor c = random_tensor({M, N}, 23);
            const std::vector<float> c0 = c.to_vector<float>();
            kernels::matmul(a, ta, b, tb, c, 1.5, 0.5);
            const bool rounded = bf16_gemm && M > 12;
            const auto want =
                reference_gemm(rounded ? rounded_to_bf16(a) : a.to_vector<float>(), ta,
                               rounded ? rounded_to_bf16(b) : b.to_vector<float>(), tb, c0, M, N, K, 1.5, 0.5);
            const double tol = 2e-6 * static_cast<double>(K + 16);
            expect_close(c.to_vector<float>(), want, tol, tol,
                         std::string(rounded ? unit : "f32") + " gemm M=" + std::to_string(M) + " N=" +
                             std::to_string(N) + " K=" + std::to_string(K) + (ta ? " Ta" : "") + (tb ? " Tb" : ""));
          }
    });
  });
  if (bf16_targets == 0) GTEST_SKIP() << "this CPU has no AVX512_BF16: only the f32 fallback was checked";
}

// The bf16 GEMM keeps the f32 one's guarantees: the same bits on any thread count, beta == 0 never reads
// C, and a NaN operand gives NaN (the rounding keeps NaNs NaN) in exactly its row.
TEST(GemmKernel, Bf16InputsKeepThreadInvarianceAndNaNs) {
  if (!kernels::cpu_has_bf16_matmul()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const test::MatmulPrecisionScope bf16(kernels::MatmulPrecision::BF16Inputs);
  const int original_threads = num_threads();
  test::for_each_bf16_tile_unit([&](const char* unit) {
    for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{300, 700, 301}, {900, 130, 520}, {2049, 64, 100}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 24);
          const Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 25);
          std::vector<Tensor> results;
          for (int threads : {1, 2, 3}) {
            set_num_threads(threads);
            Tensor c = Tensor::full({M, N}, std::nan(""));
            kernels::matmul(a, ta, b, tb, c);
            results.push_back(c);
          }
          for (size_t i = 1; i < results.size(); ++i)
            EXPECT_EQ(std::memcmp(results[0].raw_data(), results[i].raw_data(), results[0].nbytes()), 0)
                << unit << " M=" << M << " N=" << N << " K=" << K << (ta ? " Ta" : "") << (tb ? " Tb" : "") << ": "
                << (i + 1) << " threads differ from 1";
          for (float v : results[0].to_vector<float>()) ASSERT_TRUE(std::isfinite(v)) << unit;
        }
    set_num_threads(original_threads);
    const int64_t M = 20, N = 70, K = 33;
    Tensor a = random_tensor({M, K}, 26);
    a.data<float>()[5 * K + 7] = std::nanf("");
    Tensor c = Tensor::empty({M, N});
    kernels::matmul(a, false, random_tensor({K, N}, 27), false, c);
    const std::vector<float> out = c.to_vector<float>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        ASSERT_EQ(std::isnan(out[i * N + j]), i == 5) << unit << " row " << i << " column " << j;
  });
}

// convert has the scalar conversions' bits (tensor/dtype.h) on every Highway target, over several
// threads' chunks and a partial last vector: f32 to bf16 rounds to nearest even (ties both ways), keeps a
// NaN NaN and infinities infinite; bf16 to f32 is exact.
TEST(ElementwiseKernels, ConvertRoundsToNearestEvenAndWidensExactly) {
  const int64_t n = 100003;
  Tensor x = random_tensor({n}, 81, DType::F32, 100.0);
  float* v = x.data<float>();
  v[0] = std::nanf("");
  v[1] = INFINITY;
  v[2] = -INFINITY;
  v[3] = 1.0f + 1.0f / 256.0f;  // halfway, rounds down to the even 1.0
  v[4] = 1.0f + 3.0f / 256.0f;  // halfway, rounds up to the even 1 + 4/256
  v[5] = 1e-40f;                // subnormal
  v[n - 1] = -3.0f + 1.0f / 128.0f;
  std::vector<uint16_t> want(n);
  for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = f32_to_bf16(v[i]);
  for_each_cpu_target([&] {
    Tensor rounded = Tensor::empty({n}, DType::BF16), widened = Tensor::empty({n});
    kernels::convert(x, rounded);
    EXPECT_EQ(std::vector<uint16_t>(rounded.bf16_data(), rounded.bf16_data() + n), want);
    kernels::convert(rounded, widened);
    for (int64_t i = 0; i < n; ++i) {
      const float expected = bf16_to_f32(want[static_cast<size_t>(i)]);
      if (std::isnan(expected)) ASSERT_TRUE(std::isnan(widened.data<float>()[i])) << i;
      else ASSERT_EQ(widened.data<float>()[i], expected) << i;
    }
  });
  EXPECT_EQ(bf16_to_f32(want[3]), 1.0f);
  EXPECT_EQ(bf16_to_f32(want[4]), 1.0f + 4.0f / 256.0f);
}

bool same_bits(const Tensor& x, const Tensor& y) { return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0; }

// Operands held in bf16 (activations kept for the backward, autograd/saved.h) give the bits of f32
// operands holding the same values, on every path: the bf16 pairs (moved, not converted), few rows of C
// (widened for the f32 paths: in place, dot products), a C of few columns (computed as its transpose, the
// operands swapped), a batch, rows gathered from a and from b; and on the Highway targets without the bf16
// GEMM (AVX2 and below), where every path multiplies them widened.
TEST(GemmKernel, Bf16OperandsGiveTheBitsOfTheirValuesInF32) {
  if (!kernels::cpu_has_bf16_matmul()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const auto bf16_and_values = [](const Tensor& x) {
    const Tensor held = x.to(DType::BF16);
    return std::pair{held, held.to(DType::F32)};
  };
  const auto check = [&](const std::string& where, const std::function<void(const Tensor&, const Tensor&, Tensor&)>& run,
                         const Tensor& a, const Tensor& b, const Shape& c_shape) {
    const auto [a16, a_values] = bf16_and_values(a);
    const auto [b16, b_values] = bf16_and_values(b);
    Tensor want = Tensor::empty(c_shape);
    run(a_values, b_values, want);
    for (int mix = 1; mix < 4; ++mix) {
      Tensor got = Tensor::empty(c_shape);
      run(mix & 1 ? a16 : a_values, mix & 2 ? b16 : b_values, got);
      EXPECT_TRUE(same_bits(got, want)) << where << (mix & 1 ? " a bf16" : "") << (mix & 2 ? " b bf16" : "");
    }
  };
  const auto precision = kernels::MatmulPrecision::BF16Inputs;
  const test::MatmulPrecisionScope mode(precision);
  for_each_cpu_target([&] {
    test::for_each_bf16_tile_unit([&](const char* unit) {
      const std::string prefix = std::string(unit) + " on " + cpu_kernel_target();
      for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{
               {300, 130, 301}, {77, 64, 45}, {512, 16, 96}, {5, 70, 33}, {12, 200, 64}})
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            const std::string where = prefix + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" +
                                      std::to_string(K) + (ta ? " Ta" : "") + (tb ? " Tb" : "");
            check(where, [&](const Tensor& a, const Tensor& b, Tensor& c) { kernels::matmul(a, ta, b, tb, c); },
                  random_tensor(ta ? Shape{K, M} : Shape{M, K}, 61), random_tensor(tb ? Shape{N, K} : Shape{K, N}, 62),
                  {M, N});
          }
      const int64_t G = 3, M = 40, N = 70, K = 33;
      check(prefix + " batched", [](const Tensor& a, const Tensor& b, Tensor& c) { kernels::matmul(a, false, b, true, c); },
            random_tensor({G, M, K}, 64), random_tensor({G, N, K}, 65), {G, M, N});
      const Tensor picked = Tensor::from_vector<int32_t>({30}, [] {
        std::vector<int32_t> rows;
        for (int32_t i = 0; i < 30; ++i) rows.push_back((i * 7) % 50);
        return rows;
      }());
      for (int64_t rows : {30, 8})  // the pairs, and few rows of C (widened)
        check(prefix + " a gathered, " + std::to_string(rows) + " rows",
              [&](const Tensor& a, const Tensor& b, Tensor& c) {
                cpu::matmul_gathered(a, picked.narrow(0, rows), false, b, Tensor(), true, c, 1.0, 0.0, precision);
              },
              random_tensor({50, K}, 66), random_tensor({N, K}, 67), {rows, N});
      check(prefix + " b gathered",
            [&](const Tensor& a, const Tensor& b, Tensor& c) {
              cpu::matmul_gathered(a, Tensor(), true, b, picked, false, c, 1.0, 0.0, precision);
            },
            random_tensor({30, M}, 68), random_tensor({50, N}, 69), {M, N});
    });
  });
}

// The AMX tiles, their emulation (sums pair by pair in k order) and the VDPBF16PS path agree on bf16
// GEMMs of the model's shapes to within f32 rounding of the sums. Not bit for bit: the hardware adds the
// 32 products of one instruction in an order of its own (it matched neither k order, nor pairs summed
// first, nor one rounding per pair or per instruction on this machine's Xeon).
TEST(GemmKernel, AmxTilesMatchTheirEmulation) {
  if (!cpu::has_amx_bf16()) GTEST_SKIP() << "this CPU (or its kernel) gives no AMX-BF16 tiles";
  const test::MatmulPrecisionScope bf16(kernels::MatmulPrecision::BF16Inputs);
  const cpu::AmxTiles original = cpu::amx_tiles();
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{256, 128, 256}, {1024, 256, 4096}, {77, 300, 45}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Tensor a = random_tensor(ta ? Shape{K, M} : Shape{M, K}, 41);
        const Tensor b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 42);
        std::vector<std::vector<float>> results;
        for (cpu::AmxTiles tiles : {cpu::AmxTiles::Hardware, cpu::AmxTiles::Emulated, cpu::AmxTiles::Off}) {
          cpu::set_amx_tiles(tiles);
          Tensor c = Tensor::empty({M, N});
          kernels::matmul(a, ta, b, tb, c);
          results.push_back(c.to_vector<float>());
        }
        const std::string label = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                  (ta ? " Ta" : "") + (tb ? " Tb" : "");
        const double tol = 2e-6 * static_cast<double>(K + 16);
        expect_close(results[0], results[1], tol, tol, "AMX against its emulation " + label);
        expect_close(results[0], results[2], tol, tol, "AMX against VDPBF16PS " + label);
      }
  cpu::set_amx_tiles(original);
}

// An operand gathered by row (cpu::matmul_gathered: the experts' rows read from the tokens' rows) gives
// the bits of the same matmul on a gathered copy, on every path its shape takes: the dot products (a few
// rows against a transposed b), b read in place (few rows), op(a) read in place through the gather
// (narrow shares, a partial last panel, two KC blocks, more than one MC block), packed panels, few
// columns (which, gathered, stay untransposed), a transposed a whose k's lie pages apart; a transposed
// a gathered by k and b gathered by k; on every target, 1 and 2 threads, f32 and f64, and in bf16
// (pairs, AMX tiles) where the CPU has it. Indices repeat and come in any order.
TEST(GemmKernel, GatheredOperandsHaveTheBitsOfAGatheredCopy) {
  const std::vector<std::array<int64_t, 3>> shapes = {{5, 64, 40},     {13, 200, 70}, {40, 300, 33}, {130, 40, 20},
                                                      {300, 256, 260}, {2060, 24, 8}, {1030, 40, 20}};
  const auto random_rows = [](int64_t count, int64_t bound, uint64_t seed) {
    std::vector<int32_t> rows(static_cast<size_t>(count));
    uint64_t state = seed;
    for (auto& row : rows) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      row = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(bound));
    }
    return Tensor::from_vector<int32_t>({count}, rows);
  };
  const auto gathered_copy = [](const Tensor& source, const Tensor& rows) {
    if (!rows.defined()) return source;
    Tensor copy = Tensor::empty({rows.numel(), source.dim(1)}, source.dtype());
    kernels::gather_rows(source, rows, copy);
    return copy;
  };
  const int threads_before = num_threads();
  for_each_cpu_target([&] {
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (const auto& [M, N, K] : shapes)
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (int gathered : {1, 2, 3}) {  // bit 0: a gathered, bit 1: b gathered
              const bool gather_a = gathered & 1, gather_b = gathered & 2;
              if (gather_b && tb) continue;
              for (const auto& [dtype, precision] : std::vector<std::pair<DType, kernels::MatmulPrecision>>{
                       {DType::F32, kernels::MatmulPrecision::F32},
                       {DType::F32, kernels::MatmulPrecision::BF16Inputs},
                       {DType::F64, kernels::MatmulPrecision::F32}}) {
                if (precision == kernels::MatmulPrecision::BF16Inputs && !cpu::bf16_matmul_available()) continue;
                const int64_t a_rows_used = ta ? K : M, a_cols = ta ? M : K;
                const int64_t a_source_rows = gather_a ? a_rows_used / 2 + 3 : a_rows_used;
                const int64_t b_source_rows = gather_b ? K / 2 + 3 : (tb ? N : K);
                const Tensor a = random_tensor({a_source_rows, a_cols}, 171, dtype);
                const Tensor b = random_tensor({b_source_rows, tb ? K : N}, 172, dtype);
                const Tensor a_rows = gather_a ? random_rows(a_rows_used, a_source_rows, 173) : Tensor();
                const Tensor b_rows = gather_b ? random_rows(K, b_source_rows, 174) : Tensor();
                const Tensor c0 = random_tensor({M, N}, 175, dtype);
                Tensor c = c0.clone(), want = c0.clone();
                cpu::matmul_gathered(a, a_rows, ta, b, b_rows, tb, c, 1.5, 0.5, precision);
                cpu::matmul(gathered_copy(a, a_rows), ta, gathered_copy(b, b_rows), tb, want, 1.5, 0.5, precision);
                const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                         " K=" + std::to_string(K) + (ta ? " Ta" : "") + (tb ? " Tb" : "") +
                                         (gather_a ? " a gathered" : "") + (gather_b ? " b gathered" : "") +
                                         (precision == kernels::MatmulPrecision::BF16Inputs ? " bf16" : "") + " " +
                                         dtype_name(dtype) + ", threads " + std::to_string(threads);
                if (dtype == DType::F64)
                  EXPECT_EQ(c.to_vector<double>(), want.to_vector<double>()) << what;
                else
                  EXPECT_EQ(c.to_vector<float>(), want.to_vector<float>()) << what;
              }
            }
    }
  });
  set_num_threads(threads_before);
}

// beta == 0 must not read C (BLAS semantics): NaN in the output buffer does not leak into the result.
// Inside a ReusedMatmulOperands scope, a constant b is packed once (at its second use) and read from
// there by the few-row panel path: every call, first, second and later, has the bits of the same call
// outside the scope, at any width (whole and partial panels), several KC blocks of K, either layout of b,
// and for a b the scope does not hold. Scopes nest (the innermost applies); after the scope ends a
// matmul packs as usual.
TEST(GemmKernel, ReusedOperandsKeepTheBits) {
  for_each_cpu_target([] {
    for (DType dtype : {DType::F32, DType::F64}) {
      for (const bool trans_b : {true, false}) {
        const int64_t N = 150, K = 600;  // N: two whole panels and a partial one; K: three KC blocks in f32
        const Tensor w = random_tensor(trans_b ? Shape{N, K} : Shape{K, N}, 31, dtype);
        const Tensor other = random_tensor(w.shape(), 32, dtype);
        auto product = [&](const Tensor& b, int64_t M, uint64_t seed) {
          const Tensor x = random_tensor({M, K}, seed, dtype);
          Tensor c = Tensor::empty({M, N}, dtype);
          kernels::matmul(x, false, b, trans_b, c);
          return c.to(DType::F64).to_vector<double>();
        };
        std::vector<std::vector<double>> outside;
        for (int64_t M : {13, 16, 24, 25, 16}) outside.push_back(product(w, M, 40 + M));
        const std::vector<double> other_outside = product(other, 16, 7);
        const std::string what = std::string(dtype_name(dtype)) + (trans_b ? " b [N, K]" : " b [K, N]");
        {
          const kernels::ReusedMatmulOperands scope({w});
          size_t i = 0;
          for (int64_t M : {13, 16, 24, 25, 16}) EXPECT_EQ(product(w, M, 40 + M), outside[i++]) << what << " M " << M;
          EXPECT_EQ(product(other, 16, 7), other_outside) << what << ": a b the scope does not hold";
          {
            const kernels::ReusedMatmulOperands inner({other});
            for (int call = 0; call < 3; ++call) EXPECT_EQ(product(other, 16, 7), other_outside) << what << ": inner";
            EXPECT_EQ(product(w, 16, 56), outside[1]) << what << ": the outer scope's b inside the inner one";
          }
          EXPECT_EQ(product(w, 16, 56), outside[1]) << what << ": the outer scope again";
        }
        EXPECT_EQ(product(w, 16, 56), outside[1]) << what << ": after the scope";
      }
    }
  });
}

TEST(GemmKernel, BetaZeroIgnoresGarbageInC) {
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{13, 70, 20}, {3, 9, 20}, {64, 130, 300}})
    for (bool tb : {false, true}) {
      const Tensor a = random_tensor({M, K}, 14), b = random_tensor(tb ? Shape{N, K} : Shape{K, N}, 15);
      Tensor c = Tensor::full({M, N}, std::nan(""));
      kernels::matmul(a, false, b, tb, c);
      for (float v : c.to_vector<float>()) ASSERT_TRUE(std::isfinite(v)) << "M=" << M << " N=" << N;
    }
}

TEST(GemmKernel, BatchedAndSharedOperand) {
  const int64_t G = 3, M = 5, N = 17, K = 9;
  const Tensor a = random_tensor({G, M, K}, 10, DType::F64), b3 = random_tensor({G, K, N}, 11, DType::F64);
  const Tensor b2 = random_tensor({K, N}, 12, DType::F64);
  Tensor c3 = Tensor::empty({G, M, N}, DType::F64), c2 = Tensor::empty({G, M, N}, DType::F64);
  kernels::matmul(a, false, b3, false, c3);
  kernels::matmul(a, false, b2, false, c2);
  const auto av = a.to_vector<double>(), b3v = b3.to_vector<double>(), b2v = b2.to_vector<double>();
  std::vector<double> want3, want2;
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> ag(av.begin() + g * M * K, av.begin() + (g + 1) * M * K);
    std::vector<double> bg(b3v.begin() + g * K * N, b3v.begin() + (g + 1) * K * N);
    auto r3 = reference_gemm(ag, false, bg, false, {}, M, N, K, 1.0, 0.0);
    auto r2 = reference_gemm(ag, false, b2v, false, {}, M, N, K, 1.0, 0.0);
    want3.insert(want3.end(), r3.begin(), r3.end());
    want2.insert(want2.end(), r2.begin(), r2.end());
  }
  expect_close(c3.to_vector<double>(), want3, 1e-12, 1e-12);
  expect_close(c2.to_vector<double>(), want2, 1e-12, 1e-12);
}

TEST(GemmKernel, RejectsMismatchedShapes) {
  const Tensor a = Tensor::zeros({3, 4}), b = Tensor::zeros({5, 6});
  Tensor c = Tensor::zeros({3, 6});
  EXPECT_THROW(kernels::matmul(a, false, b, false, c), Error);
}

}  // namespace
}  // namespace lt
