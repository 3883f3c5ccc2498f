// Forward and backward checks of the activation, RMSNorm, softmax and cross-entropy kernels against
// plain scalar loops in double, on every Highway target of this machine, in f32 and f64. Row lengths
// 1, 3, 17, 129 and 4099 exercise single-lane rows, SIMD tails and multi-block row sums.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tensor/kernels.h"
#include "tests/test_util.h"

namespace lt {
namespace {

using test::expect_close;
using test::for_each_cpu_target;
using test::random_tensor;

const std::vector<int64_t> kLengths = {1, 3, 17, 129, 4099};

// f32 kernels against a double reference: a few f32 ulps; f64 kernels: a few f64 ulps.
template <class T>
constexpr double kRtol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
template <class T>
constexpr double kAtol = std::is_same_v<T, float> ? 1e-6 : 1e-13;

template <class T>
std::vector<double> values(const Tensor& t) {
  const std::vector<T> v = t.to_vector<T>();
  return std::vector<double>(v.begin(), v.end());
}

template <class T>
Tensor tensor_of(const Shape& shape, const std::vector<double>& v) {
  return Tensor::from_vector(shape, std::vector<T>(v.begin(), v.end()));
}

template <class T>
void expect_matches(const Tensor& actual, const std::vector<double>& expected, const std::string& what,
                    double rtol = kRtol<T>, double atol = kAtol<T>) {
  expect_close(values<T>(actual), expected, rtol, atol, what);
}

// |actual - expected| <= rtol * scale[i]: for results formed by cancellation, whose rounding error is
// relative to the magnitude of the terms (scale) rather than to the result.
template <class T>
void expect_within(const Tensor& actual, const std::vector<double>& expected, const std::vector<double>& scale,
                   double rtol, const std::string& what) {
  const std::vector<double> got = values<T>(actual);
  ASSERT_EQ(got.size(), expected.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - expected[i]) <= rtol * scale[i]) && reported++ < 5)
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", expected " << expected[i]
                    << ", allowed error " << rtol * scale[i];
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- activations -----------------------------------------------------------------------------------

template <class T>
void check_activations(const Tensor& gate, const Tensor& up, const Tensor& dy, const std::string& what) {
  const std::vector<double> g = values<T>(gate), u = values<T>(up), dyv = values<T>(dy);
  const size_t n = g.size();
  std::vector<double> silu(n), dsilu(n), swiglu(n), dgate(n), dup(n);
  for (size_t i = 0; i < n; ++i) {
    const double s = sigmoid(g[i]);
    const double derivative = s + g[i] * s * (1 - s);
    silu[i] = g[i] * s;
    dsilu[i] = dyv[i] * derivative;
    swiglu[i] = g[i] * s * u[i];
    dgate[i] = dyv[i] * u[i] * derivative;
    dup[i] = dyv[i] * g[i] * s;
  }
  Tensor y = Tensor::empty_like(gate), dx = Tensor::empty_like(gate), dg, du;
  kernels::silu(gate, y);
  expect_matches<T>(y, silu, "silu " + what);
  kernels::silu_backward(gate, dy, dx);
  expect_matches<T>(dx, dsilu, "silu_backward " + what);
  // gate and up side by side, as the fused projection writes them.
  const Tensor gate_up = test::side_by_side(gate, up);
  kernels::swiglu(gate_up, y);
  expect_matches<T>(y, swiglu, "swiglu " + what);
  Tensor dgate_up = Tensor::empty_like(gate_up);
  kernels::swiglu_backward(gate_up, dy, dgate_up);
  std::tie(dg, du) = test::halves(dgate_up);
  expect_matches<T>(dg, dgate, "swiglu_backward dgate " + what);
  expect_matches<T>(du, dup, "swiglu_backward dup " + what);
}

template <class T>
void check_activations_all_lengths() {
  const DType dtype = dtype_of<T>();
  std::vector<int64_t> lengths = kLengths;
  lengths.push_back(40009);  // more than one parallel_for chunk, with a tail in the last
  for (int64_t n : lengths)
    check_activations<T>(random_tensor({n}, 11, dtype, 4.0), random_tensor({n}, 12, dtype),
                         random_tensor({n}, 13, dtype), "n=" + std::to_string(n));
  check_activations<T>(random_tensor({3, 129}, 14, dtype, 4.0), random_tensor({3, 129}, 15, dtype),
                       random_tensor({3, 129}, 16, dtype), "[3, 129]");
  // Saturation: exp(-|x|) keeps sigmoid finite (0 or 1) for any magnitude, never inf / inf.
  const std::vector<double> extreme = {-1000, -100, -30, -1e-3, 0, 1e-3, 30, 100, 1000, -7, 7};
  const Shape shape{static_cast<int64_t>(extreme.size())};
  check_activations<T>(tensor_of<T>(shape, extreme), random_tensor(shape, 17, dtype), random_tensor(shape, 18, dtype),
                       "saturating inputs");
}

TEST(ActivationKernels, MatchScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_activations_all_lengths<float>();
    check_activations_all_lengths<double>();
  });
}

// ---- RMSNorm -------------------------------------------------------------------------------------------

struct RmsNormReference {
  std::vector<double> y, rstd, dx, dw;
};

RmsNormReference reference_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, double eps,
                                   const std::vector<double>& dy, const std::vector<double>& dw0) {
  const size_t C = w.size(), N = x.size() / C;
  RmsNormReference ref{std::vector<double>(x.size()), std::vector<double>(N), std::vector<double>(x.size()), dw0};
  for (size_t n = 0; n < N; ++n) {
    double sum_sq = 0, dot = 0;
    for (size_t j = 0; j < C; ++j) {
      sum_sq += x[n * C + j] * x[n * C + j];
      dot += w[j] * dy[n * C + j] * x[n * C + j];
    }
    const double r = 1.0 / std::sqrt(sum_sq / C + eps);
    ref.rstd[n] = r;
    for (size_t j = 0; j < C; ++j) {
      const size_t i = n * C + j;
      ref.y[i] = x[i] * r * w[j];
      ref.dx[i] = r * w[j] * dy[i] - x[i] * r * r * r * dot / C;
      ref.dw[j] += dy[i] * x[i] * r;
    }
  }
  return ref;
}

// Runs forward and backward on x and compares y, rstd, dx and dw (accumulated onto a non-zero dw).
template <class T>
void check_rmsnorm(const Tensor& x, double eps, const std::string& what, double rtol = kRtol<T>,
                   double atol = kAtol<T>) {
  const DType dtype = dtype_of<T>();
  const int64_t C = x.dim(-1);
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  const Tensor w = random_tensor({C}, 21, dtype, 0.5), dy = random_tensor(x.shape(), 22, dtype);
  const Tensor dw_initial = random_tensor({C}, 23, dtype);
  const RmsNormReference ref = reference_rmsnorm(values<T>(x), values<T>(w), eps, values<T>(dy), values<T>(dw_initial));

  Tensor y = Tensor::empty_like(x), rstd = Tensor::empty(lead, dtype);
  kernels::rmsnorm(x, w, eps, y, rstd);
  expect_matches<T>(rstd, ref.rstd, "rmsnorm rstd " + what, rtol, 0);
  expect_matches<T>(y, ref.y, "rmsnorm y " + what, rtol, atol);
  Tensor dx = Tensor::empty_like(x), dw = dw_initial.clone();
  kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw);
  expect_matches<T>(dx, ref.dx, "rmsnorm_backward dx " + what, rtol, atol * std::sqrt(double(C)));
  expect_matches<T>(dw, ref.dw, "rmsnorm_backward dw " + what, rtol, atol * double(x.numel() / C));
}

template <class T>
void check_rmsnorm_all_shapes() {
  const DType dtype = dtype_of<T>();
  for (int64_t C : kLengths)
    for (int64_t N : {1, 5})
      check_rmsnorm<T>(random_tensor({N, C}, 20, dtype), 1e-6, shape_str({N, C}));
  check_rmsnorm<T>(random_tensor({2, 3, 17}, 24, dtype), 1e-5, "[2, 3, 17]");
  check_rmsnorm<T>(random_tensor({129}, 25, dtype), 1e-6, "1-D [129]");
  check_rmsnorm<T>(random_tensor({64, 4099}, 26, dtype), 1e-6, "[64, 4099]");  // several row chunks
}

TEST(RmsNormKernels, MatchScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_rmsnorm_all_shapes<float>();
    check_rmsnorm_all_shapes<double>();
  });
}

// The statistics are accumulated in f64: f32 rows whose squares overflow (1e20^2) or underflow
// (1e-25^2) f32 still normalise correctly.
TEST(RmsNormKernels, F32RowsBeyondTheRangeOfTheirSquares) {
  for_each_cpu_target([] {
    check_rmsnorm<float>(random_tensor({3, 129}, 27, DType::F32, 1e20), 0.0, "x ~ 1e20", 1e-5, 1e-6);
    check_rmsnorm<float>(random_tensor({3, 129}, 28, DType::F32, 1e-25), 0.0, "x ~ 1e-25", 1e-5, 1e-6);
  });
}

TEST(RmsNormKernels, BackwardIsDeterministic) {
  const Tensor x = random_tensor({64, 4099}, 29), w = random_tensor({4099}, 30), dy = random_tensor({64, 4099}, 31);
  Tensor y = Tensor::empty_like(x), rstd = Tensor::empty({64});
  kernels::rmsnorm(x, w, 1e-6, y, rstd);
  std::vector<float> first_dx, first_dw;
  for (int run = 0; run < 3; ++run) {
    Tensor dx = Tensor::empty_like(x), dw = Tensor::zeros({4099});
    kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw);
    if (run == 0) {
      first_dx = dx.to_vector<float>();
      first_dw = dw.to_vector<float>();
    } else {
      EXPECT_EQ(dx.to_vector<float>(), first_dx) << "run " << run;
      EXPECT_EQ(dw.to_vector<float>(), first_dw) << "run " << run;
    }
  }
}

// dx_beta 1 adds dx to what dx holds (the residual stream's gradient begun by x's other use) with the
// bits of writing it apart and then adding, on every target, f32 and f64, rows with and without a vector
// tail. dx may not share memory with an input.
TEST(RmsNormKernels, BackwardAddsToDxWithTheBitsOfASeparateSum) {
  for_each_cpu_target([] {
    for (DType dtype : {DType::F32, DType::F64})
      for (const Shape& shape : std::vector<Shape>{{5, 64}, {3, 129}, {2, 7}}) {
        const int64_t C = shape.back();
        const Tensor x = random_tensor(shape, 32, dtype), w = random_tensor({C}, 33, dtype);
        const Tensor dy = random_tensor(shape, 34, dtype), dx0 = random_tensor(shape, 35, dtype);
        Tensor y = Tensor::empty(shape, dtype), rstd = Tensor::empty({shape[0]}, dtype);
        kernels::rmsnorm(x, w, 1e-6, y, rstd);
        Tensor dx_apart = Tensor::empty(shape, dtype), dw = Tensor::zeros({C}, dtype);
        kernels::rmsnorm_backward(x, w, rstd, dy, dx_apart, dw);
        Tensor want = Tensor::empty(shape, dtype), dx = dx0.clone(), dw_added = Tensor::zeros({C}, dtype);
        kernels::add(dx_apart, dx0, want);
        kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw_added, 1.0);
        const std::string what = std::string(dtype_name(dtype)) + " " + shape_str(shape);
        if (dtype == DType::F32) {
          EXPECT_EQ(dx.to_vector<float>(), want.to_vector<float>()) << what;
          EXPECT_EQ(dw_added.to_vector<float>(), dw.to_vector<float>()) << what;
        } else {
          EXPECT_EQ(dx.to_vector<double>(), want.to_vector<double>()) << what;
        }
      }
  });
  const Tensor x = random_tensor({3, 17}, 36), w = random_tensor({17}, 37);
  Tensor dy = random_tensor({3, 17}, 38), rstd = Tensor::empty({3}), y = Tensor::empty_like(x);
  kernels::rmsnorm(x, w, 1e-6, y, rstd);
  Tensor dx = Tensor::zeros({3, 17}), dw = Tensor::zeros({17});
  EXPECT_THROW(kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw, 0.5), Error);
  EXPECT_THROW(kernels::rmsnorm_backward(x, w, rstd, dy, dy, dw, 1.0), Error);
}

// add_rmsnorm has the bits of add then rmsnorm: the sum, y and rstd, on every target, f32 and f64, rows
// with and without a vector tail and over several row chunks.
TEST(RmsNormKernels, AddRmsNormHasTheBitsOfAddThenRmsNorm) {
  for_each_cpu_target([] {
    for (DType dtype : {DType::F32, DType::F64})
      for (const Shape& shape : std::vector<Shape>{{5, 64}, {3, 129}, {2, 7}, {2, 3, 17}, {1}, {64, 4099}}) {
        const int64_t C = shape.back();
        const Shape lead(shape.begin(), shape.end() - 1);
        const Tensor a = random_tensor(shape, 40, dtype), b = random_tensor(shape, 41, dtype);
        const Tensor w = random_tensor({C}, 42, dtype, 0.5);
        Tensor want_sum = Tensor::empty(shape, dtype), want_y = Tensor::empty(shape, dtype);
        Tensor want_rstd = Tensor::empty(lead, dtype);
        kernels::add(a, b, want_sum);
        kernels::rmsnorm(want_sum, w, 1e-6, want_y, want_rstd);
        Tensor sum = Tensor::empty(shape, dtype), y = Tensor::empty(shape, dtype), rstd = Tensor::empty(lead, dtype);
        kernels::add_rmsnorm(a, b, w, 1e-6, sum, y, rstd);
        const std::string what = std::string(dtype_name(dtype)) + " " + shape_str(shape);
        for (const auto& [got, want] : {std::pair{sum, want_sum}, std::pair{y, want_y}, std::pair{rstd, want_rstd}})
          EXPECT_EQ(got.to(DType::F64).to_vector<double>(), want.to(DType::F64).to_vector<double>()) << what;
      }
  });
}

// Under mixed precision on the CPU (autograd/saved.h) the norms and the SwiGLU write the bf16 copies
// autograd keeps in the pass that computes their rows: the roundings convert makes, the outputs unchanged;
// and the norm's and the SwiGLU's backward read x's and gate_up's copies, widening each row, with the bits
// of the kernels on the widened copies.
TEST(RmsNormKernels, KeptBf16CopiesAreWrittenAndReadWithTheBitsOfConverting) {
  const test::MatmulPrecisionScope mode(kernels::MatmulPrecision::BF16Inputs);
  const auto rounded = [](const Tensor& t) { return t.to(DType::BF16); };
  const auto same = [](const Tensor& x, const Tensor& y) {
    return std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
  };
  for_each_cpu_target([&] {
    // (1,100 columns: the SwiGLU backward widens a row's copy in pieces of 512.)
    for (const Shape& shape : std::vector<Shape>{{5, 64}, {3, 129}, {2, 3, 17}, {2, 1100}}) {
      const int64_t C = shape.back();
      const Shape lead(shape.begin(), shape.end() - 1);
      const std::string what = shape_str(shape);
      const Tensor a = random_tensor(shape, 40), b = random_tensor(shape, 41);
      const Tensor w = random_tensor({C}, 42, DType::F32, 0.5);
      Tensor y = Tensor::empty(shape), rstd = Tensor::empty(lead), y_plain = Tensor::empty(shape);
      Tensor rstd_plain = Tensor::empty(lead), x16 = Tensor::empty(shape, DType::BF16);
      Tensor y16 = Tensor::empty(shape, DType::BF16);
      kernels::rmsnorm(a, w, 1e-6, y_plain, rstd_plain);
      kernels::rmsnorm(a, w, 1e-6, y, rstd, x16, y16);
      EXPECT_TRUE(same(y, y_plain) && same(rstd, rstd_plain)) << what;
      EXPECT_TRUE(same(x16, rounded(a)) && same(y16, rounded(y))) << what;
      Tensor sum = Tensor::empty(shape), sum16 = Tensor::empty(shape, DType::BF16);
      kernels::add_rmsnorm(a, b, w, 1e-6, sum, y, rstd, sum16, y16);
      EXPECT_TRUE(same(sum16, rounded(sum)) && same(y16, rounded(y))) << what;

      const Tensor dy = random_tensor(shape, 43);
      Tensor dx = Tensor::empty(shape), dw = Tensor::zeros({C}), dx_kept = Tensor::empty(shape);
      Tensor dw_kept = Tensor::zeros({C});
      kernels::rmsnorm_backward(x16.to(DType::F32), w, rstd, dy, dx, dw);
      kernels::rmsnorm_backward(x16, w, rstd, dy, dx_kept, dw_kept);
      EXPECT_TRUE(same(dx_kept, dx) && same(dw_kept, dw)) << what;

      const Tensor gate_up = random_tensor({4, 2 * C}, 44);
      Tensor h = Tensor::empty({4, C}), h_plain = Tensor::empty({4, C});
      Tensor gate_up16 = Tensor::empty({4, 2 * C}, DType::BF16), h16 = Tensor::empty({4, C}, DType::BF16);
      kernels::swiglu(gate_up, h_plain);
      kernels::swiglu(gate_up, h, gate_up16, h16);
      EXPECT_TRUE(same(h, h_plain) && same(gate_up16, rounded(gate_up)) && same(h16, rounded(h))) << what;
      const Tensor dh = random_tensor({4, C}, 45);
      Tensor dgate_up = Tensor::empty({4, 2 * C}), dgate_up_kept = Tensor::empty({4, 2 * C});
      kernels::swiglu_backward(gate_up16.to(DType::F32), dh, dgate_up);
      kernels::swiglu_backward(gate_up16, dh, dgate_up_kept);
      EXPECT_TRUE(same(dgate_up_kept, dgate_up)) << what;
    }
  });
}

TEST(RmsNormKernels, AddRmsNormRejectsMismatchedOperands) {
  const Tensor a = random_tensor({3, 17}, 43), w = random_tensor({17}, 44);
  Tensor sum = Tensor::empty({3, 17}), y = Tensor::empty({3, 17}), rstd = Tensor::empty({3});
  EXPECT_THROW(kernels::add_rmsnorm(a, Tensor::zeros({17}), w, 1e-6, sum, y, rstd), Error);  // no broadcast
  EXPECT_THROW(kernels::add_rmsnorm(a, Tensor::zeros({3, 17}, DType::F64), w, 1e-6, sum, y, rstd), Error);
  EXPECT_THROW(kernels::add_rmsnorm(a, a, Tensor::zeros({16}), 1e-6, sum, y, rstd), Error);
  Tensor a_too = a;
  EXPECT_THROW(kernels::add_rmsnorm(a, a, w, 1e-6, a_too, y, rstd), Error);  // the sum over an addend
  // A bf16 copy is a GPU's under mixed precision only.
  EXPECT_THROW(kernels::add_rmsnorm(a, a, w, 1e-6, sum, y, rstd, Tensor::empty({3, 17}, DType::BF16)), Error);
  EXPECT_THROW(kernels::rmsnorm(a, w, 1e-6, y, rstd, Tensor::empty({3, 17}, DType::BF16)), Error);
  EXPECT_THROW(kernels::rmsnorm(a, w, 1e-6, y, rstd, Tensor(), Tensor::empty({3, 17}, DType::BF16)), Error);
  EXPECT_THROW(kernels::add_rmsnorm(a, a, w, 1e-6, sum, y, rstd, Tensor(), Tensor::empty({3, 17}, DType::BF16)),
               Error);
}

TEST(RmsNormKernels, RejectsMismatchedShapes) {
  const Tensor x = Tensor::zeros({3, 17});
  Tensor y = Tensor::empty_like(x), rstd = Tensor::empty({3});
  EXPECT_THROW(kernels::rmsnorm(x, Tensor::zeros({16}), 1e-6, y, rstd), Error);
  Tensor wrong_rstd = Tensor::empty({17});
  EXPECT_THROW(kernels::rmsnorm(x, Tensor::zeros({17}), 1e-6, y, wrong_rstd), Error);
  EXPECT_THROW(kernels::rmsnorm(x, Tensor::zeros({17}, DType::F64), 1e-6, y, rstd), Error);
}

// ---- softmax and log-softmax ----------------------------------------------------------------------------

// softmax of each row of x [N, V] in double, max-subtracted.
std::vector<double> reference_softmax(const std::vector<double>& x, size_t V) {
  std::vector<double> p(x.size());
  for (size_t row = 0; row < x.size(); row += V) {
    double max = -std::numeric_limits<double>::infinity(), sum = 0;
    for (size_t j = 0; j < V; ++j) max = std::max(max, x[row + j]);
    for (size_t j = 0; j < V; ++j) sum += std::exp(x[row + j] - max);
    for (size_t j = 0; j < V; ++j) p[row + j] = std::exp(x[row + j] - max) / sum;
  }
  return p;
}

template <class T>
void check_softmax(const Tensor& x, const std::string& what) {
  const size_t V = static_cast<size_t>(x.dim(-1));
  const std::vector<double> xv = values<T>(x);
  const Tensor dy = random_tensor(x.shape(), 41, dtype_of<T>());
  const std::vector<double> dyv = values<T>(dy);
  const std::vector<double> p = reference_softmax(xv, V);
  std::vector<double> log_p(p.size()), dx_soft(p.size()), dx_log(p.size()), dx_log_scale(p.size());
  for (size_t row = 0; row < p.size(); row += V) {
    double max = -std::numeric_limits<double>::infinity(), sum = 0, p_dot_dy = 0, dy_sum = 0;
    for (size_t j = 0; j < V; ++j) max = std::max(max, xv[row + j]);
    for (size_t j = 0; j < V; ++j) sum += std::exp(xv[row + j] - max);
    for (size_t j = 0; j < V; ++j) {
      p_dot_dy += p[row + j] * dyv[row + j];
      dy_sum += dyv[row + j];
    }
    for (size_t j = 0; j < V; ++j) {
      log_p[row + j] = xv[row + j] - max - std::log(sum);
      dx_soft[row + j] = p[row + j] * (dyv[row + j] - p_dot_dy);
      dx_log[row + j] = dyv[row + j] - p[row + j] * dy_sum;
      // exp(y) carries the rounding of y = log p times |log p|; sum(dy) that of the row's |dy|.
      dx_log_scale[row + j] =
          1e-2 + std::fabs(dyv[row + j]) + std::fabs(p[row + j] * dy_sum) * (1 + std::fabs(log_p[row + j]));
    }
  }
  Tensor y = Tensor::empty_like(x), dx = Tensor::empty_like(x);
  kernels::softmax(x, y);
  expect_matches<T>(y, p, "softmax " + what);
  kernels::softmax_backward(y, dy, dx);
  expect_matches<T>(dx, dx_soft, "softmax_backward " + what);
  kernels::log_softmax(x, y);
  expect_matches<T>(y, log_p, "log_softmax " + what);
  kernels::log_softmax_backward(y, dy, dx);
  expect_within<T>(dx, dx_log, dx_log_scale, kRtol<T>, "log_softmax_backward " + what);
}

// x + offset, elementwise.
template <class T>
Tensor shifted(const Tensor& x, double offset) {
  std::vector<double> v = values<T>(x);
  for (double& e : v) e += offset;
  return tensor_of<T>(x.shape(), v);
}

template <class T>
void check_softmax_all_shapes() {
  const DType dtype = dtype_of<T>();
  for (int64_t V : kLengths) {
    const std::string what = shape_str({3, V});
    check_softmax<T>(random_tensor({3, V}, 40, dtype, 3.0), what);
    // exp(1000) overflows even f64: only a max-subtracting kernel gets these rows right.
    check_softmax<T>(shifted<T>(random_tensor({3, V}, 42, dtype, 3.0), 1000.0), what + " around +1000");
    check_softmax<T>(shifted<T>(random_tensor({3, V}, 43, dtype, 3.0), -1000.0), what + " around -1000");
  }
  check_softmax<T>(random_tensor({2, 3, 17}, 44, dtype, 3.0), "[2, 3, 17]");
  check_softmax<T>(random_tensor({129}, 45, dtype, 3.0), "1-D [129]");
  check_softmax<T>(random_tensor({5, 150001}, 46, dtype, 3.0), "[5, 150001]");  // a Ling-sized vocabulary row
  // A row mixing -1000 and +1000: exp(-2000) underflows to an exact 0, the rest normalise.
  check_softmax<T>(tensor_of<T>({2, 5}, {-1000, 1000, 999, -1000, 998, 1, 2, 3, 4, 5}), "mixed +-1000");
}

TEST(SoftmaxKernels, MatchScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_softmax_all_shapes<float>();
    check_softmax_all_shapes<double>();
  });
}

// exp itself, read back exactly: with y = [x, 0] and dy = [0, -1], log_softmax_backward's dx[0] is
// 0 - exp(x) * sum(dy) = exp(x), with no rounding of its own. The kernels' exp takes only arguments <= 0
// (tensor/cpu/exp-inl.h): within 2 ulp of exp in double down to the smallest normal float, 0 below it.
TEST(SoftmaxKernels, ExpOfNonPositiveArgumentsWithinTwoUlp) {
  std::vector<double> xs;
  for (int i = 0; i <= 40000; ++i) xs.push_back(-87.3 * i / 40000.0);
  for (double x : {-1e-30, -1e-7, -0.34657359, -0.34657360, -0.5, -0.6931472, -1.0, -87.33, -87.35, -88.0, -100.0, -1e4,
                   -std::numeric_limits<double>::infinity()})
    xs.push_back(x);
  const int64_t rows = static_cast<int64_t>(xs.size());
  std::vector<double> y_values, dy_values;
  for (double x : xs) {
    y_values.insert(y_values.end(), {x, 0.0});
    dy_values.insert(dy_values.end(), {0.0, -1.0});
  }
  for_each_cpu_target([&] {
    const Tensor y = tensor_of<float>({rows, 2}, y_values), dy = tensor_of<float>({rows, 2}, dy_values);
    Tensor dx = Tensor::empty_like(y);
    kernels::log_softmax_backward(y, dy, dx);
    const float* got = dx.data<float>();
    int reported = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double x = static_cast<double>(static_cast<float>(xs[static_cast<size_t>(r)]));
      const double exact = std::exp(x), value = got[2 * r];
      const bool ok = x < -87.34   ? value == 0.0
                      : x < -87.33 ? true  // subnormal results: not held to 2 ulp
                                   : std::fabs(value - exact) <= 2.0 * std::ldexp(1.0, std::ilogb(exact) - 23);
      if (!ok && reported++ < 5) ADD_FAILURE() << "exp(" << x << ") = " << value << ", expected " << exact;
    }
  });
}

TEST(SoftmaxKernels, RejectsMismatchedShapes) {
  const Tensor x = Tensor::zeros({3, 17});
  Tensor y = Tensor::empty({3, 16});
  EXPECT_THROW(kernels::softmax(x, y), Error);
  EXPECT_THROW(kernels::log_softmax(x, y), Error);
  Tensor dx = Tensor::empty_like(x);
  EXPECT_THROW(kernels::softmax_backward(x, Tensor::zeros({3, 17}, DType::F64), dx), Error);
}

// ---- cross-entropy ----------------------------------------------------------------------------------------

template <class T, class I>
void check_cross_entropy(const Tensor& logits, const std::vector<I>& ids, int64_t ignore_index, const std::string& what,
                         double backward_rtol = kRtol<T>) {
  const DType dtype = dtype_of<T>();
  const size_t N = ids.size(), V = static_cast<size_t>(logits.dim(-1));
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  const Tensor targets = Tensor::from_vector(lead, ids);
  const Tensor dloss = random_tensor(lead, 51, dtype);
  const std::vector<double> x = values<T>(logits), dl = values<T>(dloss);
  const std::vector<double> p = reference_softmax(x, V);
  std::vector<double> loss(N), lse(N), dx(x.size(), 0.0);
  for (size_t n = 0; n < N; ++n) {
    double max = -std::numeric_limits<double>::infinity(), sum = 0;
    for (size_t j = 0; j < V; ++j) max = std::max(max, x[n * V + j]);
    for (size_t j = 0; j < V; ++j) sum += std::exp(x[n * V + j] - max);
    lse[n] = max + std::log(sum);
    if (ids[n] == ignore_index) continue;
    loss[n] = (max - x[n * V + ids[n]]) + std::log(sum);
    for (size_t j = 0; j < V; ++j) dx[n * V + j] = dl[n] * (p[n * V + j] - (j == size_t(ids[n]) ? 1.0 : 0.0));
  }
  Tensor loss_t = Tensor::empty(lead, dtype), lse_t = Tensor::empty(lead, dtype);
  kernels::cross_entropy(logits, targets, ignore_index, loss_t, lse_t);
  expect_matches<T>(loss_t, loss, "cross_entropy loss " + what);
  expect_matches<T>(lse_t, lse, "cross_entropy lse " + what);
  Tensor dlogits = Tensor::empty_like(logits);
  kernels::cross_entropy_backward(logits, targets, ignore_index, lse_t, dloss, dlogits);
  expect_matches<T>(dlogits, dx, "cross_entropy_backward " + what, backward_rtol);
}

// N targets in [0, V), rows 2 and 5 (when present) set to ignore_index.
template <class I>
std::vector<I> targets_with_ignored(size_t N, int64_t V, int64_t ignore_index, uint64_t seed) {
  Rng rng(seed);
  std::vector<I> ids(N);
  for (size_t n = 0; n < N; ++n) ids[n] = n == 2 || n == 5 ? I(ignore_index) : I(rng.below(uint64_t(V)));
  return ids;
}

template <class T, class I>
void check_cross_entropy_all_shapes() {
  const DType dtype = dtype_of<T>();
  for (int64_t V : kLengths) {
    const std::string what = std::string(sizeof(I) == 4 ? "i32 " : "i64 ") + shape_str({7, V});
    const std::vector<I> ids = targets_with_ignored<I>(7, V, -100, uint64_t(V));
    check_cross_entropy<T, I>(random_tensor({7, V}, 50, dtype, 3.0), ids, -100, what);
    // lse ~ 1000 is stored in T: in f32 its rounding (~3e-5) carries into exp(x - lse) of the backward.
    check_cross_entropy<T, I>(shifted<T>(random_tensor({7, V}, 52, dtype, 3.0), 1000.0), ids, -100,
                              what + " around +1000", std::is_same_v<T, float> ? 2e-4 : kRtol<T>);
  }
  check_cross_entropy<T, I>(random_tensor({2, 4, 129}, 53, dtype), targets_with_ignored<I>(8, 129, -100, 54), -100,
                            "leading shape [2, 4]");
  // ignore_index may be any id, including a valid one: rows whose target is 0 are then ignored.
  check_cross_entropy<T, I>(random_tensor({4, 17}, 55, dtype), {0, 3, 0, 16}, 0, "ignore_index 0");
  check_cross_entropy<T, I>(random_tensor({3, 17}, 56, dtype), {-100, -100, -100}, -100, "all ignored");
}

TEST(CrossEntropyKernels, MatchScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_cross_entropy_all_shapes<float, int32_t>();
    check_cross_entropy_all_shapes<float, int64_t>();
    check_cross_entropy_all_shapes<double, int32_t>();
    check_cross_entropy_all_shapes<double, int64_t>();
  });
}

// A target outside [0, V) that is not ignore_index is an error naming the id and V, forward and backward.
TEST(CrossEntropyKernels, OutOfRangeTargetIsAnErrorNamingIdAndVocabulary) {
  const Tensor logits = Tensor::zeros({3, 5});
  Tensor loss = Tensor::empty({3}), lse = Tensor::empty({3}), dlogits = Tensor::empty_like(logits);
  struct BadTargets {
    Tensor targets;
    int64_t bad_id;
  };
  for (const BadTargets& c : {BadTargets{Tensor::from_vector<int32_t>({3}, {0, 5, 1}), 5},
                              BadTargets{Tensor::from_vector<int64_t>({3}, {0, 4, -1}), -1},
                              BadTargets{Tensor::from_vector<int64_t>({3}, {1000000000000, 4, 1}), 1000000000000}}) {
    try {
      kernels::cross_entropy(logits, c.targets, -100, loss, lse);
      ADD_FAILURE() << "no error for target " << c.bad_id;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("target id " + std::to_string(c.bad_id)), std::string::npos) << message;
      EXPECT_NE(message.find("[0, 5)"), std::string::npos) << message;
    }
    EXPECT_THROW(kernels::cross_entropy_backward(logits, c.targets, -100, lse, Tensor::zeros({3}), dlogits), Error);
  }
  // -100 is only skipped when it is the ignore_index.
  EXPECT_THROW(kernels::cross_entropy(logits, Tensor::from_vector<int32_t>({3}, {0, -100, 1}), -1, loss, lse), Error);
}

TEST(CrossEntropyKernels, RejectsBadOperands) {
  const Tensor logits = Tensor::zeros({3, 5});
  Tensor loss = Tensor::empty({3}), lse = Tensor::empty({3});
  EXPECT_THROW(kernels::cross_entropy(logits, Tensor::zeros({3}), -100, loss, lse), Error);  // float targets
  EXPECT_THROW(kernels::cross_entropy(logits, Tensor::from_vector<int32_t>({2}, {0, 1}), -100, loss, lse), Error);
  Tensor wrong_loss = Tensor::empty({4});
  EXPECT_THROW(kernels::cross_entropy(logits, Tensor::from_vector<int32_t>({3}, {0, 1, 2}), -100, wrong_loss, lse),
               Error);
}

// The mean over the kept targets, formed from a count tensor (so a GPU step reads nothing back): the
// arithmetic of sum, then scale by 1 / count, bit for bit; 0 and zero row weights when every target is
// ignored.
TEST(CrossEntropyKernels, MeanOverTheKeptTargets) {
  const Tensor values = random_tensor({5}, 60);
  Tensor count = Tensor::empty({1}, DType::I64), mean = Tensor::empty({1}), dvalues = Tensor::empty({5});
  for (const Tensor& targets : {Tensor::from_vector<int32_t>({5}, {3, -100, 0, -100, 7}),
                                Tensor::from_vector<int64_t>({5}, {3, -100, 0, -100, 7})}) {
    kernels::count_targets(targets, -100, count);
    EXPECT_EQ(count.to_vector<int64_t>(), std::vector<int64_t>{3});
  }
  kernels::mean_over_count(values, count, mean);
  Tensor expected = Tensor::empty({1});
  kernels::sum(values, expected);
  kernels::scale(expected, 1.0 / 3.0, expected);
  EXPECT_EQ(mean.item(), expected.item());
  kernels::mean_over_count_backward(Tensor::full({1}, 0.3), count, dvalues);
  EXPECT_EQ(dvalues.to_vector<float>(), std::vector<float>(5, static_cast<float>(double(0.3f) / 3.0)));

  kernels::count_targets(Tensor::from_vector<int64_t>({2, 1}, {-100, -100}), -100, count);
  EXPECT_EQ(count.to_vector<int64_t>(), std::vector<int64_t>{0});
  kernels::mean_over_count(values, count, mean);
  EXPECT_EQ(mean.item(), 0.0);
  kernels::mean_over_count_backward(Tensor::full({1}, 0.3), count, dvalues);
  EXPECT_EQ(dvalues.to_vector<float>(), std::vector<float>(5, 0.0f));

  Tensor f32_count = Tensor::empty({1});
  EXPECT_THROW(kernels::count_targets(Tensor::from_vector<int32_t>({1}, {0}), -100, f32_count), Error);
  EXPECT_THROW(kernels::count_targets(Tensor::zeros({3}), -100, count), Error);  // float targets
  Tensor two = Tensor::empty({2});
  EXPECT_THROW(kernels::mean_over_count(values, count, two), Error);
}

}  // namespace
}  // namespace lt
