// The indexing kernels against plain scalar loops on every Highway target of this machine, in f32 and
// f64 with i32 and i64 indices; top-k ordering and tie-breaking; out-of-range indices.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

#include "tensor/kernels.h"
#include "tensor/threadpool.h"
#include "tests/test_util.h"

namespace lt {
namespace {

using test::expect_close;
using test::for_each_cpu_target;
using test::random_tensor;

// n indices in [0, bound) drawn from a seeded stream, with repeats whenever n > bound.
template <class I>
Tensor random_indices(const Shape& shape, int64_t bound, uint64_t seed) {
  Rng rng(seed);
  std::vector<I> values(static_cast<size_t>(shape_numel(shape)));
  for (I& v : values) v = static_cast<I>(rng.below(static_cast<uint64_t>(bound)));
  return Tensor::from_vector<I>(shape, values);
}

template <class T, class I>
void check_rows(DType dtype) {
  // (table rows R, columns C, index shape): columns 1, 3, 17, 129 hit single lanes and SIMD tails; 4096
  // columns with many indices is large enough to be split across threads.
  struct Case {
    int64_t R, C;
    Shape idx_shape;
  };
  for (const Case& c : std::vector<Case>{{5, 1, {7}}, {4, 3, {2, 5}}, {9, 17, {20}}, {3, 129, {4, 2}}, {64, 4096, {40}}}) {
    SCOPED_TRACE("R=" + std::to_string(c.R) + " C=" + std::to_string(c.C) + " idx " + shape_str(c.idx_shape));
    const Tensor table = random_tensor({c.R, c.C}, 1, dtype);
    const Tensor idx = random_indices<I>(c.idx_shape, c.R, 2);
    Shape rows_shape = c.idx_shape;
    rows_shape.push_back(c.C);
    const std::vector<T> tv = table.to_vector<T>();
    const std::vector<I> iv = idx.to_vector<I>();
    const int64_t n = idx.numel();

    Tensor out = Tensor::empty(rows_shape, dtype);
    kernels::gather_rows(table, idx, out);
    std::vector<T> want_gather(static_cast<size_t>(n * c.C));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c.C; ++j) want_gather[r * c.C + j] = tv[iv[r] * c.C + j];
    expect_close(out.to_vector<T>(), want_gather, 0, 0, "gather_rows");

    // Scatter onto a non-zero start: the kernel adds, it does not overwrite. The reference adds in
    // n order, as the kernel promises, so the comparison is exact.
    const Tensor src = random_tensor(rows_shape, 3, dtype);
    const Tensor start = random_tensor({c.R, c.C}, 4, dtype);
    Tensor acc = start.clone();
    kernels::scatter_add_rows(src, idx, acc);
    const std::vector<T> sv = src.to_vector<T>();
    std::vector<T> want_scatter = start.to_vector<T>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c.C; ++j) want_scatter[iv[r] * c.C + j] += sv[r * c.C + j];
    expect_close(acc.to_vector<T>(), want_scatter, 0, 0, "scatter_add_rows");
  }
}

template <class T, class I>
void check_cols(DType dtype) {
  for (const auto& [N, E, K] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 3, 5}, {17, 17, 4}, {5, 129, 8}, {300, 64, 6}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " E=" + std::to_string(E) + " K=" + std::to_string(K));
    const Tensor x = random_tensor({N, E}, 5, dtype);
    const Tensor idx = random_indices<I>({N, K}, E, 6);
    const std::vector<T> xv = x.to_vector<T>();
    const std::vector<I> iv = idx.to_vector<I>();

    Tensor out = Tensor::empty({N, K}, dtype);
    kernels::gather_cols(x, idx, out);
    std::vector<T> want_gather(static_cast<size_t>(N * K));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j) want_gather[n * K + j] = xv[n * E + iv[n * K + j]];
    expect_close(out.to_vector<T>(), want_gather, 0, 0, "gather_cols");

    const Tensor dout = random_tensor({N, K}, 7, dtype);
    const Tensor start = random_tensor({N, E}, 8, dtype);
    Tensor dx = start.clone();
    kernels::scatter_add_cols(dout, idx, dx);
    const std::vector<T> dv = dout.to_vector<T>();
    std::vector<T> want_scatter = start.to_vector<T>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j) want_scatter[n * E + iv[n * K + j]] += dv[n * K + j];
    expect_close(dx.to_vector<T>(), want_scatter, 0, 0, "scatter_add_cols");
  }
}

// Reference top-k: a stable sort of the column indices by descending value keeps equal values in
// index order, which is exactly "ties go to the lower index".
template <class T>
void reference_topk(const std::vector<T>& x, int64_t N, int64_t E, int64_t k, std::vector<T>& values,
                    std::vector<int32_t>& indices) {
  values.clear();
  indices.clear();
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[e] = static_cast<int32_t>(e);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[n * E + a] > x[n * E + b]; });
    for (int64_t j = 0; j < k; ++j) {
      indices.push_back(order[j]);
      values.push_back(x[n * E + order[j]]);
    }
  }
}

template <class T>
void check_topk(DType dtype) {
  for (const auto& [N, E, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {4, 3, 3}, {17, 17, 2}, {5, 129, 8}, {300, 64, 6}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " E=" + std::to_string(E) + " k=" + std::to_string(k));
    // Values on a coarse grid so that rows hold many ties.
    Rng rng(9);
    std::vector<T> xv(static_cast<size_t>(N * E));
    for (T& v : xv) v = static_cast<T>(static_cast<double>(rng.below(7)) - 3.0);
    const Tensor x = Tensor::from_vector<T>({N, E}, xv);
    Tensor values = Tensor::empty({N, k}, dtype), indices = Tensor::empty({N, k}, DType::I32);
    kernels::topk(x, k, values, indices);
    std::vector<T> want_values;
    std::vector<int32_t> want_indices;
    reference_topk(xv, N, E, k, want_values, want_indices);
    EXPECT_EQ(indices.to_vector<int32_t>(), want_indices);
    EXPECT_EQ(values.to_vector<T>(), want_values);
  }
}

TEST(IndexKernels, RowsMatchScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_rows<float, int32_t>(DType::F32);
    check_rows<float, int64_t>(DType::F32);
    check_rows<double, int32_t>(DType::F64);
    check_rows<double, int64_t>(DType::F64);
  });
}

// A kept bf16 copy's rows (expert parallelism sends them) move as they are: the rows of the gathered f32
// rows' rounding. An f32 table rounds into bf16 rows on a GPU only.
TEST(IndexKernels, Bf16RowsMoveAsTheyAre) {
  const Tensor table = random_tensor({9, 70}, 16), idx = random_indices<int32_t>({20}, 9, 17);
  Tensor rows = Tensor::empty({20, 70}), rows16 = Tensor::empty({20, 70}, DType::BF16);
  kernels::gather_rows(table, idx, rows);
  kernels::gather_rows(table.to(DType::BF16), idx, rows16);
  const Tensor want = rows.to(DType::BF16);
  EXPECT_EQ(std::memcmp(rows16.raw_data(), want.raw_data(), want.nbytes()), 0);
  EXPECT_THROW(kernels::gather_rows(table, idx, rows16), Error);
}

TEST(IndexKernels, ColsMatchScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_cols<float, int32_t>(DType::F32);
    check_cols<float, int64_t>(DType::F32);
    check_cols<double, int32_t>(DType::F64);
    check_cols<double, int64_t>(DType::F64);
  });
}

TEST(IndexKernels, TopKMatchesStableSortOnEveryTarget) {
  for_each_cpu_target([] {
    check_topk<float>(DType::F32);
    check_topk<double>(DType::F64);
  });
}

TEST(IndexKernels, TopKTiesGoToTheLowerIndex) {
  const Tensor x = Tensor::from_vector<float>({2, 6}, {1, 5, 3, 5, 5, 0,  //
                                                       2, 2, 2, 2, 2, 2});
  Tensor values = Tensor::empty({2, 4}), indices = Tensor::empty({2, 4}, DType::I32);
  kernels::topk(x, 4, values, indices);
  EXPECT_EQ(indices.to_vector<int32_t>(), (std::vector<int32_t>{1, 3, 4, 2, 0, 1, 2, 3}));
  EXPECT_EQ(values.to_vector<float>(), (std::vector<float>{5, 5, 5, 3, 2, 2, 2, 2}));
}

TEST(IndexKernels, TopKRanksNanAboveEverything) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::from_vector<float>({1, 4}, {1, nan, 7, -2});
  Tensor values = Tensor::empty({1, 2}), indices = Tensor::empty({1, 2}, DType::I32);
  kernels::topk(x, 2, values, indices);
  EXPECT_EQ(indices.to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(std::isnan(values.to_vector<float>()[0]));
}

TEST(IndexKernels, ScatterAddRowsIsBitIdenticalAcrossThreadCounts) {
  // Many contributions to few rows: a summation order that depended on the split would show here.
  const Tensor src = random_tensor({2000, 300}, 10), idx = random_indices<int32_t>({2000}, 3, 11);
  const int original_threads = num_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor out = Tensor::zeros({3, 300});
    kernels::scatter_add_rows(src, idx, out);
    results.push_back(out.to_vector<float>());
  }
  set_num_threads(original_threads);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// The error must name the offending index and the bound; the output must be left as it was.
void expect_range_error(const std::function<void()>& call, const std::string& index, const std::string& bound) {
  try {
    call();
    ADD_FAILURE() << "expected an lt::Error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("index " + index), std::string::npos) << what;
    EXPECT_NE(what.find("[0, " + bound + ")"), std::string::npos) << what;
  }
}

TEST(IndexKernels, OutOfRangeIndicesAreErrors) {
  const Tensor table = random_tensor({5, 3}, 12);
  Tensor rows_out = Tensor::zeros({3, 3});
  expect_range_error([&] { kernels::gather_rows(table, Tensor::from_vector<int32_t>({3}, {0, 5, 1}), rows_out); }, "5", "5");
  expect_range_error([&] { kernels::gather_rows(table, Tensor::from_vector<int64_t>({3}, {0, -1, 1}), rows_out); }, "-1",
                     "5");
  EXPECT_EQ(rows_out.to_vector<float>(), std::vector<float>(9, 0.f));

  Tensor scatter_out = Tensor::zeros({5, 3});
  expect_range_error([&] { kernels::scatter_add_rows(rows_out, Tensor::from_vector<int64_t>({3}, {4, 0, 9}), scatter_out); },
                     "9", "5");
  EXPECT_EQ(scatter_out.to_vector<float>(), std::vector<float>(15, 0.f));

  const Tensor x = random_tensor({2, 4}, 13);
  Tensor picked = Tensor::empty({2, 2});
  expect_range_error([&] { kernels::gather_cols(x, Tensor::from_vector<int32_t>({2, 2}, {0, 3, 4, 1}), picked); }, "4", "4");
  Tensor dx = Tensor::zeros({2, 4});
  expect_range_error([&] { kernels::scatter_add_cols(picked, Tensor::from_vector<int64_t>({2, 2}, {0, -3, 1, 1}), dx); },
                     "-3", "4");
  EXPECT_EQ(dx.to_vector<float>(), std::vector<float>(8, 0.f));
}

TEST(IndexKernels, RejectsBadShapesAndDtypes) {
  const Tensor table = random_tensor({5, 3}, 14);
  const Tensor idx = Tensor::from_vector<int32_t>({2}, {0, 1});
  Tensor wrong_cols = Tensor::empty({2, 4});
  EXPECT_THROW(kernels::gather_rows(table, idx, wrong_cols), Error);
  Tensor out = Tensor::empty({2, 3});
  EXPECT_THROW(kernels::gather_rows(table, Tensor::from_vector<float>({2}, {0, 1}), out), Error);
  EXPECT_THROW(kernels::gather_rows(table.to(DType::F64), idx, out), Error);

  const Tensor x = random_tensor({2, 4}, 15);
  Tensor values = Tensor::empty({2, 5}), indices = Tensor::empty({2, 5}, DType::I32);
  EXPECT_THROW(kernels::topk(x, 5, values, indices), Error);  // k > E
  Tensor values2 = Tensor::empty({2, 2}), indices_i64 = Tensor::empty({2, 2}, DType::I64);
  EXPECT_THROW(kernels::topk(x, 2, values2, indices_i64), Error);
}

}  // namespace
}  // namespace lt
