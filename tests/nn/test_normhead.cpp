// NormHead and the fused head + losses: the fused ops against the unfused ops they replace, the
// detached head gradient against g / ||W|| (it is by design not the derivative of the forward, so the
// gradient check cannot cover it), and gradients written straight into a leaf's gradient buffer.
#include <gtest/gtest.h>

#include <algorithm>

#include "autograd/ops.h"
#include "nn/normhead.h"
#include "tensor/bf16_shadow.h"
#include "tensor/kernels.h"
#include "tests/test_util.h"

namespace lt {
namespace {

struct Problem {
  Tensor h, w, targets;
};

// N = 300 rows: two chunks of the fused op. Every 5th target is ignored.
Problem problem(int64_t N = 300, int64_t H = 6, int64_t V = 37) {
  Rng rng(21);
  std::vector<int64_t> ids(static_cast<size_t>(N));
  for (size_t n = 0; n < ids.size(); ++n) ids[n] = n % 5 == 0 ? -100 : static_cast<int64_t>(rng.below(V));
  return {Tensor::randn({N, H}, rng, 1.0, DType::F64), Tensor::randn({V, H}, rng, 0.5, DType::F64),
          Tensor::from_vector<int64_t>({N}, ids)};
}

struct Result {
  double loss;
  std::vector<double> dh, dw;
};

Result fused(const Problem& p, HeadNorm norm) {
  const Variable h(p.h.clone(), true), w(p.w.clone(), true);
  const Variable loss = normhead_cross_entropy(h, w, p.targets, -100, norm);
  loss.backward();
  // (f32 problems as well: their values widen exactly.)
  return {loss.value().item(), h.grad().to(DType::F64).to_vector<double>(),
          w.grad().to(DType::F64).to_vector<double>()};
}

Result unfused(const Problem& p, HeadNorm norm) {
  const Variable h(p.h.clone(), true), w(p.w.clone(), true);
  const Variable head = norm == HeadNorm::None ? w : column_normalize(w, norm == HeadNorm::Detached);
  const Variable loss = cross_entropy(matmul(h, head, false, true), p.targets, -100);
  loss.backward();
  return {loss.value().item(), h.grad().to_vector<double>(), w.grad().to_vector<double>()};
}

TEST(NormHeadCrossEntropy, MatchesTheUnfusedOps) {
  const Problem p = problem();
  for (HeadNorm norm : {HeadNorm::None, HeadNorm::Detached, HeadNorm::Full}) {
    SCOPED_TRACE(static_cast<int>(norm));
    const Result a = fused(p, norm), b = unfused(p, norm);
    EXPECT_NEAR(a.loss, b.loss, 1e-12);
    test::expect_close(a.dh, b.dh, 1e-10, 1e-15, "dh");
    test::expect_close(a.dw, b.dw, 1e-10, 1e-15, "dw");
  }
}

TEST(NormHeadCrossEntropy, DetachedHeadGradientIsThePlainGradientOverTheNorm) {
  // With the norm detached, dL/dW[v, j] = G[v, j] / n_j, G the gradient of the same loss taken with
  // respect to the normalised head W' as a free variable.
  const Problem p = problem(40, 5, 23);
  const Result detached = fused(p, HeadNorm::Detached);
  Tensor normalized;
  {
    NoGradGuard no_grad;
    normalized = column_normalize(Variable(p.w), true).value();
  }
  const Variable h(p.h.clone(), true), w_normalized(normalized, true);
  normhead_cross_entropy(h, w_normalized, p.targets, -100, HeadNorm::None).backward();
  const std::vector<double> w = p.w.to_vector<double>(), g = w_normalized.grad().to_vector<double>();
  const int64_t V = p.w.dim(0), H = p.w.dim(1);
  std::vector<double> expected(g.size());
  for (int64_t j = 0; j < H; ++j) {
    double sum_sq = 0;
    for (int64_t v = 0; v < V; ++v) sum_sq += w[v * H + j] * w[v * H + j];
    for (int64_t v = 0; v < V; ++v) expected[v * H + j] = g[v * H + j] / (std::sqrt(sum_sq) + 1e-7);
  }
  test::expect_close(detached.dw, expected, 1e-10, 1e-15, "detached dW");
  test::expect_close(detached.dh, h.grad().to_vector<double>(), 1e-10, 1e-15, "dh");
}

TEST(NormHeadCrossEntropy, WritesIntoALeafGradientBufferAndAccumulates) {
  const Problem p = problem(50, 4, 11);
  for (HeadNorm norm : {HeadNorm::None, HeadNorm::Detached, HeadNorm::Full}) {
    SCOPED_TRACE(static_cast<int>(norm));
    const Result once = fused(p, norm);
    Variable h(p.h.clone(), true), w(p.w.clone(), true);
    Tensor buffer = Tensor::full(p.w.shape(), 123.0, DType::F64);  // stale contents must not leak in
    w.set_grad_buffer(buffer);
    normhead_cross_entropy(h, w, p.targets, -100, norm).backward();
    EXPECT_TRUE(w.grad().shares_storage(buffer));
    test::expect_close(w.grad().to_vector<double>(), once.dw, 1e-14, 0, "first backward");
    normhead_cross_entropy(h, w, p.targets, -100, norm).backward();
    std::vector<double> twice = once.dw;
    for (double& v : twice) v *= 2;
    test::expect_close(w.grad().to_vector<double>(), twice, 1e-14, 0, "accumulated");
    w.zero_grad();
    EXPECT_FALSE(w.grad().defined());
  }
}

TEST(NormHeadCrossEntropy, WithoutGradModeGivesTheSameLoss) {
  const Problem p = problem();
  const Result with_grad = fused(p, HeadNorm::Detached);
  NoGradGuard no_grad;
  const Variable loss = normhead_cross_entropy(Variable(p.h, true), Variable(p.w, true), p.targets, -100,
                                               HeadNorm::Detached);
  EXPECT_EQ(loss.value().item(), with_grad.loss);
  EXPECT_FALSE(loss.requires_grad());
}

// Under mixed precision on a CPU with the bf16 GEMM the head's weights are rounded once for the products
// of every chunk (weight_gemm_operand), not in each product's packing: the bits of weights that already
// hold their bf16 values, which the products' rounding leaves as they are. With a registered copy of the
// weights (a GPU step's, tensor/bf16_shadow.h) the products read that copy: one of 2 W gives the loss of 2 W.
TEST(NormHeadCrossEntropy, UnderMixedPrecisionTheWeightsAreRoundedOnceWithTheBitsOfEachProducts) {
  if (!kernels::cpu_has_bf16_matmul()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const test::MatmulPrecisionScope mixed(kernels::MatmulPrecision::BF16Inputs);
  Problem p = problem(600, 64, 300);  // three chunks
  p.h = p.h.to(DType::F32);
  p.w = p.w.to(DType::F32);
  Problem rounded = p;
  rounded.w = p.w.to(DType::BF16).to(DType::F32);
  ASSERT_NE(rounded.w.to_vector<float>(), p.w.to_vector<float>());
  const Result a = fused(p, HeadNorm::None), b = fused(rounded, HeadNorm::None);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.dh, b.dh);
  EXPECT_EQ(a.dw, b.dw);

  Problem doubled = p;
  doubled.w = Tensor::empty_like(p.w);
  kernels::scale(p.w, 2.0, doubled.w);
  const Variable h(p.h.clone(), true), w(p.w.clone(), true);
  const Bf16Shadow registered(w.value(), doubled.w.to(DType::BF16));
  EXPECT_EQ(normhead_cross_entropy(h, w, p.targets, -100, HeadNorm::None).value().item(),
            fused(doubled, HeadNorm::None).loss);
}

// The per-token log-probabilities DPO sums against -(per-token cross-entropy) the unfused way, from the
// full [N, V] logits; and the gradients of a weighted sum of them against those of log_softmax gathered
// at the targets. Rows 100-199 have every target ignored: 0, and no gradient.
TEST(NormHeadTokenLogprobs, MatchesTheUnfusedPerTokenCrossEntropy) {
  const int64_t N = 300;  // two chunks of the fused pass
  Problem p = problem(N, 6, 37);
  std::vector<int64_t> ids = p.targets.to_vector<int64_t>();
  std::fill(ids.begin() + 100, ids.begin() + 200, -100);
  p.targets = Tensor::from_vector<int64_t>({N}, ids);
  std::vector<double> weights(static_cast<size_t>(N));  // d loss / d logprobs[n]
  Rng rng(5);
  for (double& w : weights) w = rng.normal();
  std::vector<int32_t> picked_ids(ids.size());
  std::vector<double> picked_weights(ids.size());
  for (size_t n = 0; n < ids.size(); ++n) {
    picked_ids[n] = ids[n] == -100 ? 0 : static_cast<int32_t>(ids[n]);
    picked_weights[n] = ids[n] == -100 ? 0.0 : weights[n];
  }
  for (HeadNorm norm : {HeadNorm::None, HeadNorm::Detached, HeadNorm::Full}) {
    SCOPED_TRACE(static_cast<int>(norm));
    const Variable h(p.h.clone(), true), w(p.w.clone(), true);
    const Variable logprobs = normhead_token_logprobs(h, w, p.targets, -100, norm);
    ASSERT_EQ(logprobs.shape(), Shape{N});
    sum(mul(logprobs, Variable(Tensor::from_vector<double>({N}, weights)))).backward();

    const Variable h_ref(p.h.clone(), true), w_ref(p.w.clone(), true);
    const Variable head = norm == HeadNorm::None ? w_ref : column_normalize(w_ref, norm == HeadNorm::Detached);
    const Variable logits = matmul(h_ref, head, false, true);
    Tensor row_loss = Tensor::empty({N}, DType::F64), lse = Tensor::empty({N}, DType::F64);
    kernels::cross_entropy(logits.value(), p.targets, -100, row_loss, lse);
    std::vector<double> expected = row_loss.to_vector<double>();
    for (double& e : expected) e = -e;
    test::expect_close(logprobs.value().to_vector<double>(), expected, 1e-12, 1e-12, "logprobs");
    EXPECT_EQ(logprobs.value().to_vector<double>()[150], 0.0);

    const Variable picked = gather_cols(log_softmax(logits), Tensor::from_vector<int32_t>({N, 1}, picked_ids));
    sum(mul(picked, Variable(Tensor::from_vector<double>({N, 1}, picked_weights)))).backward();
    test::expect_close(h.grad().to_vector<double>(), h_ref.grad().to_vector<double>(), 1e-10, 1e-15, "dh");
    test::expect_close(w.grad().to_vector<double>(), w_ref.grad().to_vector<double>(), 1e-10, 1e-15, "dw");
  }
}

}  // namespace
}  // namespace lt
