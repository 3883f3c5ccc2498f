// The fused router and combine kernels against the generic kernels and plain loops they replace:
// router_topk is softmax then topk then renormalisation, with topk's ranking (ties to the lower index);
// combine_rows is the weighted sum of each token's expert rows.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "tensor/kernels.h"
#include "tests/test_util.h"

namespace lt {
namespace {

using test::expect_close;
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
  }
}

TEST(MoEKernels, CombineRowsRejectsAPositionOutOfRange) {
  const Tensor y = Tensor::zeros({4, 2}), w = Tensor::zeros({2, 2});
  Tensor out = Tensor::empty({2, 2});
  EXPECT_THROW(kernels::combine_rows(y, w, Tensor::from_vector<int32_t>({4}, {0, 1, 2, 4}), out), Error);
}

}  // namespace
}  // namespace lt
