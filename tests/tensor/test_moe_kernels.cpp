// The fused router and combine kernels against the generic kernels and plain loops they replace:
// router_topk is softmax then topk then renormalisation, with topk's ranking (ties to the lower index);
// combine_rows is the weighted sum of each token's expert rows; swiglu_combine_backward is swiglu, the
// combine's backward and swiglu_backward in a row.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "tensor/kernels.h"
#include "tests/test_util.h"

namespace lt {
namespace {

using test::expect_close;
using test::for_each_cpu_target;
using test::random_tensor;

void check_router_topk(DType dtype, const Tensor& logits, int64_t k, bool renormalize) {
  const int64_t N = logits.dim(0), E = logits.dim(1);
  Tensor probs = Tensor::empty({N, E}, dtype), lse = Tensor::empty({N}, dtype), weights = Tensor::empty({N, k}, dtype);
  Tensor ids = Tensor::empty({N, k}, DType::I32);
  kernels::router_topk(logits, k, renormalize, probs, lse, weights, ids);

  Tensor want_probs = Tensor::empty({N, E}, dtype), want_values = Tensor::empty({N, k}, dtype);
  Tensor want_ids = Tensor::empty({N, k}, DType::I32);
  kernels::softmax(logits, want_probs);
  kernels::topk(want_probs, k, want_values, want_ids);
  const double tol = dtype == DType::F32 ? 1e-6 : 1e-14;
  expect_close(probs.to(DType::F64).to_vector<double>(), want_probs.to(DType::F64).to_vector<double>(), tol, tol,
               "probs");
  EXPECT_EQ(ids.to_vector<int32_t>(), want_ids.to_vector<int32_t>());
  const std::vector<double> s = logits.to(DType::F64).to_vector<double>();
  const std::vector<double> v = want_values.to(DType::F64).to_vector<double>();
  const std::vector<double> w = weights.to(DType::F64).to_vector<double>();
  const std::vector<double> l = lse.to(DType::F64).to_vector<double>();
  for (int64_t n = 0; n < N; ++n) {
    double total = 0, max = s[n * E];
    for (int64_t e = 0; e < E; ++e) max = std::max(max, s[n * E + e]);
    for (int64_t e = 0; e < E; ++e) total += std::exp(s[n * E + e] - max);
    EXPECT_NEAR(l[n], max + std::log(total), tol * 10) << "lse row " << n;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += v[n * k + j];
    for (int64_t j = 0; j < k; ++j)
      EXPECT_NEAR(w[n * k + j], renormalize ? v[n * k + j] / sum : v[n * k + j], tol) << "weight " << n << ", " << j;
  }
}

TEST(MoEKernels, RouterTopKIsSoftmaxThenTopKThenRenormalise) {
  for (DType dtype : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{{17, 5, 2}, {129, 64, 6}, {3, 1, 1}};
    for (const auto& [N, E, k] : shapes)
      for (bool renormalize : {true, false})
        check_router_topk(dtype, random_tensor({N, E}, 31, dtype, 3.0), k, renormalize);
    // Equal logits: every probability ties and the lower indices win, as in topk.
    check_router_topk(dtype, Tensor::full({4, 8}, 0.5, dtype), 3, true);
  }
}

TEST(MoEKernels, CombineRowsSumsEachTokensExpertRowsInSlotOrder) {
  for (DType dtype : {DType::F32, DType::F64}) {
    const int64_t N = 9, k = 3, C = 37, M = N * k;
    const Tensor y = random_tensor({M, C}, 32, dtype), w = random_tensor({N, k}, 33, dtype);
    std::vector<int32_t> position(M);
    for (int32_t a = 0; a < M; ++a) position[a] = (a * 5) % M;  // 5 is coprime with 27
    const Tensor pos = Tensor::from_vector<int32_t>({M}, position);
    Tensor out = Tensor::empty({N, C}, dtype);
    kernels::combine_rows(y, w, pos, out);
    const std::vector<double> yv = y.to(DType::F64).to_vector<double>(), wv = w.to(DType::F64).to_vector<double>();
    std::vector<double> want(N * C, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < k; ++j)
        for (int64_t c = 0; c < C; ++c) want[n * C + c] += wv[n * k + j] * yv[position[n * k + j] * C + c];
    const double tol = dtype == DType::F32 ? 1e-5 : 1e-13;
    expect_close(out.to(DType::F64).to_vector<double>(), want, tol, tol, dtype_name(dtype));
    // out_beta 1: the same sums added to what out holds, with the bits of the sum apart plus out.
    const Tensor before = random_tensor({N, C}, 34, dtype);
    Tensor added = before.clone(), want_added = Tensor::empty({N, C}, dtype);
    kernels::combine_rows(y, w, pos, added, 1.0);
    kernels::add(out, before, want_added);
    EXPECT_EQ(added.to(DType::F64).to_vector<double>(), want_added.to(DType::F64).to_vector<double>())
        << dtype_name(dtype);
    EXPECT_THROW(kernels::combine_rows(y, w, pos, added, 0.5), Error);
    Tensor inside_y = y.narrow(0, N);
    EXPECT_THROW(kernels::combine_rows(y, w, pos, inside_y, 1.0), Error);
  }
}

// The three passes the fused kernel replaces, in T: h = swiglu(gate_up); per assignment a at row m,
// dw[a] = dot(t[m], h[m]) (here in f64), h[m] *= w[a], t[m] *= w[a]; then swiglu_backward of t.
template <class T>
void check_swiglu_combine_backward(DType dtype, int64_t C) {
  const int64_t N = 9, k = 3, M = N * k;
  std::vector<int32_t> position(M);
  for (int32_t a = 0; a < M; ++a) position[a] = (a * 5) % M;
  const Tensor pos = Tensor::from_vector<int32_t>({M}, position);
  Tensor gate = Tensor::empty({M, C}, dtype);
  kernels::scale(random_tensor({M, C}, 34, dtype), 6.0, gate);  // saturating sigmoids too
  const Tensor gate_up = test::side_by_side(gate, random_tensor({M, C}, 35, dtype));
  const Tensor t = random_tensor({M, C}, 36, dtype), w = random_tensor({N, k}, 37, dtype);

  Tensor h_want = Tensor::empty({M, C}, dtype);
  kernels::swiglu(gate_up, h_want);
  Tensor dy = t.clone();
  std::vector<double> dw_want(M);
  {
    T* hv = h_want.data<T>();
    T* dyv = dy.data<T>();
    const T* wv = w.data<T>();
    for (int64_t a = 0; a < M; ++a) {
      const int64_t row = position[a] * C;
      for (int64_t c = 0; c < C; ++c) dw_want[a] += static_cast<double>(dyv[row + c]) * hv[row + c];
      for (int64_t c = 0; c < C; ++c) {
        hv[row + c] *= wv[a];
        dyv[row + c] *= wv[a];
      }
    }
  }
  Tensor dgate_up_want = Tensor::empty({M, 2 * C}, dtype);
  kernels::swiglu_backward(gate_up, dy, dgate_up_want);

  for (bool with_dw : {true, false}) {
    const Tensor t_before = t.clone();
    Tensor h = Tensor::full({M, C}, NAN, dtype), dgate_up = Tensor::full({M, 2 * C}, NAN, dtype);
    Tensor dw = with_dw ? Tensor::full({N, k}, NAN, dtype) : Tensor();
    kernels::swiglu_combine_backward(w, pos, gate_up, t, h, dgate_up, dw);
    EXPECT_EQ(dgate_up.to_vector<T>(), dgate_up_want.to_vector<T>()) << "dgate_up, C " << C;
    EXPECT_EQ(h.to_vector<T>(), h_want.to_vector<T>()) << "h, C " << C;
    EXPECT_EQ(t.to_vector<T>(), t_before.to_vector<T>()) << "t is only read, C " << C;
    const double tol = dtype == DType::F32 ? 1e-5 : 1e-13;
    if (with_dw) expect_close(dw.to(DType::F64).to_vector<double>(), dw_want, tol, tol, "dw");
  }
}

TEST(MoEKernels, SwigluCombineBackwardIsSwigluThenTheCombinesBackwardThenSwigluBackward) {
  for (int64_t C : {1, 37, 64, 300}) {
    check_swiglu_combine_backward<float>(DType::F32, C);
    check_swiglu_combine_backward<double>(DType::F64, C);
  }
}

// Under mixed precision on the CPU the kernel reads gate_up as autograd keeps it, in bf16, widening each
// element as it reads it: the bits of the kernel on the widened f32 tensor, on every Highway target (the
// partial last vector too).
TEST(MoEKernels, SwigluCombineBackwardReadsAKeptBf16GateUpWithTheBitsOfWidening) {
  const test::MatmulPrecisionScope mode(kernels::MatmulPrecision::BF16Inputs);
  const int64_t N = 5, k = 2, M = N * k;
  for (int64_t C : {37, 300}) {
    Tensor gate = Tensor::empty({M, C});
    kernels::scale(random_tensor({M, C}, 71), 6.0, gate);
    const Tensor gate_up16 = test::side_by_side(gate, random_tensor({M, C}, 72)).to(DType::BF16);
    const Tensor gate_up_widened = gate_up16.to(DType::F32), t = random_tensor({M, C}, 73);
    const Tensor w = random_tensor({N, k}, 74), pos = Tensor::from_vector<int32_t>({M}, {3, 0, 9, 1, 4, 2, 8, 5, 7, 6});
    for_each_cpu_target([&] {
      Tensor h = Tensor::empty({M, C}), dgate_up = Tensor::empty({M, 2 * C}), dw = Tensor::empty({N, k});
      Tensor h_kept = Tensor::empty({M, C}), dgate_up_kept = Tensor::empty({M, 2 * C}), dw_kept = Tensor::empty({N, k});
      kernels::swiglu_combine_backward(w, pos, gate_up_widened, t, h, dgate_up, dw);
      kernels::swiglu_combine_backward(w, pos, gate_up16, t, h_kept, dgate_up_kept, dw_kept);
      EXPECT_EQ(h_kept.to_vector<float>(), h.to_vector<float>()) << "h, C " << C;
      EXPECT_EQ(dgate_up_kept.to_vector<float>(), dgate_up.to_vector<float>()) << "dgate_up, C " << C;
      EXPECT_EQ(dw_kept.to_vector<float>(), dw.to_vector<float>()) << "dw, C " << C;
    });
  }
}

TEST(MoEKernels, SwigluCombineBackwardRejectsOutputsThatShareMemory) {
  const int64_t N = 2, k = 2, M = N * k, C = 8;
  const Tensor w = random_tensor({N, k}, 38), pos = Tensor::from_vector<int32_t>({M}, {2, 0, 3, 1});
  const Tensor gate_up = random_tensor({M, 2 * C}, 39), t = random_tensor({M, C}, 41);
  Tensor h = Tensor::empty({M, C}), dgate_up = Tensor::empty({M, 2 * C}), dw;
  Tensor t_view = t, gate_up_view = gate_up;
  Tensor h_inside_dgate_up = dgate_up.reshape({2 * M, C}).narrow(0, M);
  EXPECT_THROW(kernels::swiglu_combine_backward(w, pos, gate_up, t, t_view, dgate_up, dw), Error);
  EXPECT_THROW(kernels::swiglu_combine_backward(w, pos, gate_up, t, h, gate_up_view, dw), Error);
  EXPECT_THROW(kernels::swiglu_combine_backward(w, pos, gate_up, t, h_inside_dgate_up, dgate_up, dw), Error);
  EXPECT_THROW(
      kernels::swiglu_combine_backward(w, Tensor::from_vector<int32_t>({M}, {0, 1, 2, 4}), gate_up, t, h, dgate_up, dw),
      Error);
  // gate_up must be t's rows with twice the columns.
  Tensor not_twice = random_tensor({M, C}, 42);
  EXPECT_THROW(kernels::swiglu_combine_backward(w, pos, not_twice, t, h, dgate_up, dw), Error);
  // Operands written in bf16 for the GEMMs are a GPU's under mixed precision only.
  Tensor h16 = Tensor::empty({M, C}, DType::BF16), dgate_up16 = Tensor::empty({M, 2 * C}, DType::BF16);
  EXPECT_THROW(kernels::swiglu_combine_backward(w, pos, gate_up, t, h16, dgate_up, dw), Error);
  EXPECT_THROW(kernels::swiglu_combine_backward(w, pos, gate_up, t, h, dgate_up16, dw), Error);
  EXPECT_THROW(kernels::swiglu(gate_up, h16), Error);
  EXPECT_NO_THROW(kernels::swiglu_combine_backward(w, pos, gate_up, t, h, dgate_up, dw));
}

TEST(MoEKernels, SwigluRejectsAGateUpThatIsNotTwiceItsOutput) {
  const Tensor gate_up = random_tensor({3, 10}, 43);
  Tensor wrong_width = Tensor::empty({3, 4}), wrong_rows = Tensor::empty({2, 5}), odd_input = Tensor::empty({3, 2});
  EXPECT_THROW(kernels::swiglu(gate_up, wrong_width), Error);
  EXPECT_THROW(kernels::swiglu(gate_up, wrong_rows), Error);
  EXPECT_THROW(kernels::swiglu(random_tensor({3, 5}, 44), odd_input), Error);
  Tensor dgate_up = Tensor::empty({3, 10}), dgate_up_short = Tensor::empty({3, 8});
  EXPECT_THROW(kernels::swiglu_backward(gate_up, random_tensor({3, 4}, 45), dgate_up), Error);
  EXPECT_THROW(kernels::swiglu_backward(gate_up, random_tensor({3, 5}, 45), dgate_up_short), Error);
  Tensor y = Tensor::empty({3, 5});
  EXPECT_NO_THROW(kernels::swiglu(gate_up, y));
}

TEST(MoEKernels, CombineRowsRejectsAPositionOutOfRange) {
  const Tensor y = Tensor::zeros({4, 2}), w = Tensor::zeros({2, 2});
  Tensor out = Tensor::empty({2, 2});
  EXPECT_THROW(kernels::combine_rows(y, w, Tensor::from_vector<int32_t>({4}, {0, 1, 2, 4}), out), Error);
}

}  // namespace
}  // namespace lt
