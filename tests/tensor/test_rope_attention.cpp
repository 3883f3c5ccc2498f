// RoPE and causal grouped-query attention kernels against plain scalar loops in double (a naive full
// softmax for attention), on every Highway target of this machine, in f32 and f64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/kernels.h"
#include "tests/io/temp_dir.h"
#include "tensor/threadpool.h"
#include "tests/test_util.h"

namespace lt {
namespace {

using test::expect_close;
using test::for_each_cpu_target;
using test::random_tensor;

template <class T>
std::vector<double> to_double(const Tensor& t) {
  const std::vector<T> values = t.to_vector<T>();
  return {values.begin(), values.end()};
}

template <class T>
std::vector<T> to_type(const std::vector<double>& values) {
  return {values.begin(), values.end()};
}

// Tolerances against a double reference: f32 results carry rounding of their f32 arithmetic.
struct Tolerance {
  double rtol, atol;
};
template <class T>
Tolerance tolerance() {
  return sizeof(T) == 4 ? Tolerance{2e-4, 2e-5} : Tolerance{1e-10, 1e-12};
}

// ---- rope -------------------------------------------------------------------------------------------

// Rotate-half RoPE of x [B, T, H, D] in double, straight from the definition.
std::vector<double> reference_rope(const std::vector<double>& x, const Shape& shape, double theta, int64_t pos_offset,
                                   bool inverse) {
  const int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3], half = D / 2;
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = ((b * T + t) * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(pos_offset + t) * std::pow(theta, -2.0 * i / D);
          const double c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
          const double a = x[row + i], bb = x[row + i + half];
          y[row + i] = a * c - bb * s;
          y[row + i + half] = bb * c + a * s;
        }
      }
  return y;
}

template <class T>
void check_rope(DType dtype) {
  const Tolerance tol = tolerance<T>();
  for (int64_t seq : {1, 3, 17, 129})
    for (int64_t D : {2, 6, 64, 130})
      for (const auto& [theta, pos_offset] : std::vector<std::pair<double, int64_t>>{{10000.0, 0}, {600000.0, 16000}})
        for (bool inverse : {false, true}) {
          const Shape shape{2, seq, 3, D};
          const Tensor x = random_tensor(shape, 21, dtype);
          Tensor y = Tensor::empty_like(x);
          kernels::rope(x, theta, pos_offset, inverse, y);
          const auto want = reference_rope(to_double<T>(x), shape, theta, pos_offset, inverse);
          expect_close(y.to_vector<T>(), to_type<T>(want), tol.rtol, tol.atol,
                       "rope " + shape_str(shape) + " pos " + std::to_string(pos_offset) + (inverse ? " inverse" : ""));
        }
}

TEST(RopeKernel, MatchesScalarLoopsOnEveryTarget) {
  for_each_cpu_target([] {
    check_rope<float>(DType::F32);
    check_rope<double>(DType::F64);
  });
}

// The fused projection's split: q and k are rope() of their column blocks, v a copy of its block, and
// the backward writes the inverse rotations (and dv) back into exactly those columns.
template <class T>
void check_split_qkv(DType dtype) {
  const int64_t B = 2, S = 17, Hq = 4, Hkv = 2, D = 18, C = (Hq + 2 * Hkv) * D, pos_offset = 5;
  const double theta = 600000.0;
  const Tensor qkv = random_tensor({B, S, C}, 23, dtype);
  Tensor q = Tensor::empty({B, S, Hq, D}, dtype), k = Tensor::empty({B, S, Hkv, D}, dtype);
  Tensor v = Tensor::empty({B, S, Hkv, D}, dtype);
  kernels::split_qkv_rope(qkv, theta, pos_offset, q, k, v);
  const std::vector<double> all = to_double<T>(qkv);
  auto block = [&](int64_t start, int64_t heads) {
    std::vector<double> out;
    for (int64_t row = 0; row < B * S; ++row)
      out.insert(out.end(), all.begin() + row * C + start, all.begin() + row * C + start + heads * D);
    return out;
  };
  const Tolerance tol = tolerance<T>();
  const auto want_q = reference_rope(block(0, Hq), {B, S, Hq, D}, theta, pos_offset, false);
  const auto want_k = reference_rope(block(Hq * D, Hkv), {B, S, Hkv, D}, theta, pos_offset, false);
  expect_close(q.to_vector<T>(), to_type<T>(want_q), tol.rtol, tol.atol, "q");
  expect_close(k.to_vector<T>(), to_type<T>(want_k), tol.rtol, tol.atol, "k");
  expect_close(v.to_vector<T>(), to_type<T>(block((Hq + Hkv) * D, Hkv)), 0, 0, "v");

  // Backward of the split applied to its own outputs: the inverse rotation restores qkv.
  Tensor back = Tensor::full({B, S, C}, NAN, dtype);  // every element must be written
  kernels::split_qkv_rope_backward(q, k, v, theta, pos_offset, back);
  expect_close(back.to_vector<T>(), qkv.to_vector<T>(), tol.rtol, tol.atol, "inverse");
}

TEST(RopeKernel, SplitOfTheFusedProjection) {
  for_each_cpu_target([] {
    check_split_qkv<float>(DType::F32);
    check_split_qkv<double>(DType::F64);
  });
}

// The split into a KV cache: each row's q and its new cache rows hold the bits of split_qkv_rope of that
// row alone at its own offset, on every target; the rest of the cache is left as it was.
TEST(RopeKernel, SplitIntoTheCacheMatchesEachRowAlone) {
  for_each_cpu_target([] {
    for (DType dtype : {DType::F32, DType::F64}) {
      const int64_t B = 3, T = 2, Hq = 4, Hkv = 2, D = 10, capacity = 9, C = (Hq + 2 * Hkv) * D;
      const std::vector<int64_t> Tk_B = {0, 7, 3};
      const Tensor qkv = random_tensor({B, T, C}, 81, dtype);
      const Tensor k_before = random_tensor({B, capacity, Hkv, D}, 82, dtype);
      const Tensor v_before = random_tensor({B, capacity, Hkv, D}, 83, dtype);
      Tensor q = Tensor::empty({B, T, Hq, D}, dtype);
      Tensor k_cache = k_before.clone(), v_cache = v_before.clone();
      kernels::split_qkv_rope_to_cache(qkv, 5000.0, Tk_B, q, k_cache, v_cache);
      Tensor k_want = k_before.clone(), v_want = v_before.clone();
      for (int64_t b = 0; b < B; ++b) {
        Tensor q_row = Tensor::empty({1, T, Hq, D}, dtype);
        Tensor k_row = Tensor::empty({1, T, Hkv, D}, dtype), v_row = Tensor::empty({1, T, Hkv, D}, dtype);
        kernels::split_qkv_rope(qkv.narrow(b, 1), 5000.0, Tk_B[b], q_row, k_row, v_row);
        EXPECT_EQ(q.narrow(b, 1).to(DType::F64).to_vector<double>(), q_row.to(DType::F64).to_vector<double>())
            << dtype_name(dtype) << " row " << b;
        k_want.narrow(b, 1).reshape({capacity, Hkv, D}).narrow(Tk_B[b], T).copy_from(k_row.reshape({T, Hkv, D}));
        v_want.narrow(b, 1).reshape({capacity, Hkv, D}).narrow(Tk_B[b], T).copy_from(v_row.reshape({T, Hkv, D}));
      }
      EXPECT_EQ(k_cache.to(DType::F64).to_vector<double>(), k_want.to(DType::F64).to_vector<double>()) << "k";
      EXPECT_EQ(v_cache.to(DType::F64).to_vector<double>(), v_want.to(DType::F64).to_vector<double>()) << "v";
    }
  });
}

TEST(RopeKernel, SplitIntoTheCacheRejectsBadArguments) {
  const Tensor qkv = random_tensor({2, 1, 40}, 1);
  Tensor q = Tensor::empty({2, 1, 2, 10});
  Tensor k_cache = Tensor::zeros({2, 4, 1, 10}), v_cache = Tensor::zeros({2, 4, 1, 10});
  test::expect_error([&] { kernels::split_qkv_rope_to_cache(qkv, 1e4, {0, 4}, q, k_cache, v_cache); },
                     {"exceed the capacity 4"});
  test::expect_error([&] { kernels::split_qkv_rope_to_cache(qkv, 1e4, {0}, q, k_cache, v_cache); },
                     {"1 cached lengths for 2 rows"});
  Tensor narrow_v = Tensor::zeros({2, 3, 1, 10});
  test::expect_error([&] { kernels::split_qkv_rope_to_cache(qkv, 1e4, {0, 1}, q, k_cache, narrow_v); }, {"v_cache"});
}

TEST(RopeKernel, InverseUndoesRope) {
  for_each_cpu_target([] {
    for (DType dtype : {DType::F32, DType::F64}) {
      const Tensor x = random_tensor({2, 17, 3, 130}, 22, dtype);
      Tensor y = Tensor::empty_like(x), back = Tensor::empty_like(x);
      kernels::rope(x, 600000.0, 9, false, y);
      kernels::rope(y, 600000.0, 9, true, back);
      const double tol = dtype == DType::F32 ? 1e-5 : 1e-13;
      expect_close(back.to(DType::F64).to_vector<double>(), x.to(DType::F64).to_vector<double>(), tol, tol,
                   dtype_name(dtype));
    }
  });
}

TEST(RopeKernel, PositionZeroIsIdentity) {
  for_each_cpu_target([] {
    const Tensor x = random_tensor({3, 1, 4, 66}, 23);
    Tensor y = Tensor::empty_like(x);
    kernels::rope(x, 10000.0, 0, false, y);
    expect_close(y.to_vector<float>(), x.to_vector<float>(), 0, 0, "T=1 at position 0");
  });
}

TEST(RopeKernel, InPlaceMatchesOutOfPlace) {
  for_each_cpu_target([] {
    const Tensor x = random_tensor({2, 17, 3, 130}, 24);
    Tensor y = Tensor::empty_like(x), in_place = x.clone();
    kernels::rope(x, 10000.0, 3, false, y);
    kernels::rope(in_place, 10000.0, 3, false, in_place);
    expect_close(in_place.to_vector<float>(), y.to_vector<float>(), 0, 0, "in place");
  });
}

TEST(RopeKernel, RejectsBadArguments) {
  const Tensor odd = Tensor::zeros({1, 2, 1, 3}), flat = Tensor::zeros({2, 4}), x = Tensor::zeros({1, 2, 1, 4});
  Tensor odd_y = Tensor::zeros({1, 2, 1, 3}), flat_y = Tensor::zeros({2, 4}), y = Tensor::zeros({1, 2, 1, 4});
  EXPECT_THROW(kernels::rope(odd, 10000.0, 0, false, odd_y), Error);
  EXPECT_THROW(kernels::rope(flat, 10000.0, 0, false, flat_y), Error);
  EXPECT_THROW(kernels::rope(x, 10000.0, -1, false, y), Error);
  Tensor wrong = Tensor::zeros({1, 2, 1, 6});
  EXPECT_THROW(kernels::rope(x, 10000.0, 0, false, wrong), Error);
}

// ---- attention --------------------------------------------------------------------------------------

struct Dims {
  int64_t B, T, Hq, Hkv, D;
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " Hq=" + std::to_string(Hq) +
           " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D);
  }
};

struct AttentionReference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Naive causal attention in double: the full softmax of each score row, then its textbook gradient.
// With doc_start ([B * T]), query i sees keys doc_start[i] .. i only.
AttentionReference reference_attention(const Dims& n, const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& v, const std::vector<double>& dout, double scale,
                                       const std::vector<int32_t>& doc_start = {}) {
  const int64_t group = n.Hq / n.Hkv;
  auto q_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * n.T + t) * n.Hq + h) * n.D; };
  auto kv_at = [&](int64_t b, int64_t t, int64_t h) { return ((b * n.T + t) * n.Hkv + h) * n.D; };
  AttentionReference ref;
  ref.out.assign(q.size(), 0.0);
  ref.dq.assign(q.size(), 0.0);
  ref.dk.assign(k.size(), 0.0);
  ref.dv.assign(k.size(), 0.0);
  ref.lse.assign(n.B * n.Hq * n.T, 0.0);
  std::vector<double> p(n.T), dp(n.T);
  for (int64_t b = 0; b < n.B; ++b)
    for (int64_t h = 0; h < n.Hq; ++h) {
      const int64_t kv = h / group;
      for (int64_t i = 0; i < n.T; ++i) {
        const int64_t qi = q_at(b, i, h);
        const int64_t first = doc_start.empty() ? 0 : doc_start[b * n.T + i];
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t j = first; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < n.D; ++d) dot += q[qi + d] * k[kv_at(b, j, kv) + d];
          p[j] = scale * dot;
          max_score = std::max(max_score, p[j]);
        }
        double sum = 0;
        for (int64_t j = first; j <= i; ++j) sum += (p[j] = std::exp(p[j] - max_score));
        ref.lse[(b * n.Hq + h) * n.T + i] = max_score + std::log(sum);
        for (int64_t j = first; j <= i; ++j) p[j] /= sum;
        for (int64_t j = first; j <= i; ++j)
          for (int64_t d = 0; d < n.D; ++d) ref.out[qi + d] += p[j] * v[kv_at(b, j, kv) + d];
        // dP_j = dout_i . v_j; dS_j = P_j (dP_j - sum_l P_l dP_l).
        double weighted = 0;
        for (int64_t j = first; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < n.D; ++d) dot += dout[qi + d] * v[kv_at(b, j, kv) + d];
          dp[j] = dot;
          weighted += p[j] * dot;
        }
        for (int64_t j = first; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - weighted);
          const int64_t kj = kv_at(b, j, kv);
          for (int64_t d = 0; d < n.D; ++d) {
            ref.dq[qi + d] += scale * ds * k[kj + d];
            ref.dk[kj + d] += scale * ds * q[qi + d];
            ref.dv[kj + d] += p[j] * dout[qi + d];
          }
        }
      }
    }
  return ref;
}

std::vector<Dims> attention_sizes() {
  std::vector<Dims> sizes;
  for (int64_t T : {1, 3, 17, 129})  // 129 spans several of the kernel's 64-row blocks
    for (int64_t D : {3, 17, 64})
      for (const auto& [Hq, Hkv] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {4, 2}, {3, 1}})
        sizes.push_back({Hq == 4 ? 2 : 1, T, Hq, Hkv, D});
  return sizes;
}

template <class T>
void check_attention(DType dtype, const Dims& n, double input_std, const std::vector<int32_t>& doc_start = {}) {
  const Tolerance tol = tolerance<T>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(n.D));
  const Tensor q = random_tensor({n.B, n.T, n.Hq, n.D}, 31, dtype, input_std);
  const Tensor k = random_tensor({n.B, n.T, n.Hkv, n.D}, 32, dtype, input_std);
  const Tensor v = random_tensor({n.B, n.T, n.Hkv, n.D}, 33, dtype);
  const Tensor dout = random_tensor({n.B, n.T, n.Hq, n.D}, 34, dtype);
  const auto ref =
      reference_attention(n, to_double<T>(q), to_double<T>(k), to_double<T>(v), to_double<T>(dout), scale, doc_start);
  const Tensor starts = doc_start.empty() ? Tensor() : Tensor::from_vector<int32_t>({n.B, n.T}, doc_start);

  Tensor out = Tensor::empty_like(q), lse = Tensor::empty({n.B, n.Hq, n.T}, dtype);
  kernels::attention(q, k, v, scale, out, lse, starts);
  expect_close(out.to_vector<T>(), to_type<T>(ref.out), tol.rtol, tol.atol, "out " + n.str());
  expect_close(lse.to_vector<T>(), to_type<T>(ref.lse), tol.rtol, tol.atol, "lse " + n.str());

  // Gradients are written, not added: start them from NaN to catch an element left unwritten.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor dq = Tensor::full(q.shape(), nan, dtype), dk = Tensor::full(k.shape(), nan, dtype);
  Tensor dv = Tensor::full(k.shape(), nan, dtype);
  kernels::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, starts);
  expect_close(dq.to_vector<T>(), to_type<T>(ref.dq), tol.rtol, tol.atol, "dq " + n.str());
  expect_close(dk.to_vector<T>(), to_type<T>(ref.dk), tol.rtol, tol.atol, "dk " + n.str());
  expect_close(dv.to_vector<T>(), to_type<T>(ref.dv), tol.rtol, tol.atol, "dv " + n.str());
}

TEST(AttentionKernel, ForwardAndBackwardMatchNaiveSoftmaxOnEveryTarget) {
  for_each_cpu_target([] {
    for (const Dims& n : attention_sizes()) {
      check_attention<float>(DType::F32, n, 1.0);
      check_attention<double>(DType::F64, n, 1.0);
    }
  });
}

// Scores of several tens (q and k with std 4: s ~ N(0, 256)) make exp overflow without the running-max
// shift; the online softmax must still match the reference across block boundaries.
TEST(AttentionKernel, LargeScoresStayAccurate) {
  for_each_cpu_target([] {
    check_attention<float>(DType::F32, {1, 129, 2, 1, 17}, 4.0);
    check_attention<double>(DType::F64, {1, 129, 2, 1, 17}, 4.0);
  });
}

// doc_start of documents of the given lengths packed into each row (the same packing in every row
// but shifted by one document per row, so rows differ).
std::vector<int32_t> packed_starts(int64_t B, int64_t T, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> starts(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (size_t d = static_cast<size_t>(b); t < T; ++d) {
      const int64_t start = t, length = lengths[d % lengths.size()];
      for (; t < std::min(T, start + length); ++t) starts[static_cast<size_t>(b * T + t)] = static_cast<int32_t>(start);
    }
  }
  return starts;
}

// Packed documents: a document of one token, documents ending and starting on a block boundary (64),
// one spanning blocks, and rows whose last document runs past the end.
TEST(AttentionKernel, DocumentMaskMatchesNaiveSoftmaxOnEveryTarget) {
  for_each_cpu_target([] {
    for (const std::vector<int64_t>& lengths : std::vector<std::vector<int64_t>>{
             {1, 63, 64, 5, 100}, {64}, {7, 1, 1, 30}, {200}, {129, 3}}) {
      for (const Dims& n : {Dims{2, 200, 4, 2, 17}, Dims{1, 129, 3, 1, 8}, Dims{2, 17, 2, 2, 5}}) {
        const std::vector<int32_t> starts = packed_starts(n.B, n.T, lengths);
        check_attention<float>(DType::F32, n, 1.0, starts);
        check_attention<double>(DType::F64, n, 1.0, starts);
      }
    }
  });
}

// The property packing needs: a row of packed documents gives each document exactly what attention over
// that document alone gives (to rounding: the kernel's blocks fall differently).
TEST(AttentionKernel, PackedDocumentsEqualEachDocumentAlone) {
  const std::vector<int64_t> lengths = {50, 1, 90, 59};
  const int64_t T = 200, Hq = 4, Hkv = 2, D = 16;
  const double scale = 0.25;
  const Tensor q = random_tensor({1, T, Hq, D}, 51), k = random_tensor({1, T, Hkv, D}, 52);
  const Tensor v = random_tensor({1, T, Hkv, D}, 53), dout = random_tensor({1, T, Hq, D}, 54);
  const Tensor starts = Tensor::from_vector<int32_t>({1, T}, packed_starts(1, T, lengths));
  Tensor out = Tensor::empty_like(q), lse = Tensor::empty({1, Hq, T});
  kernels::attention(q, k, v, scale, out, lse, starts);
  Tensor dq = Tensor::empty_like(q), dk = Tensor::empty_like(k), dv = Tensor::empty_like(v);
  kernels::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, starts);
  int64_t begin = 0;
  for (const int64_t length : lengths) {
    auto part = [&](const Tensor& x) {  // positions [begin, begin + length) of a [1, T, H, D] tensor
      const int64_t H = x.dim(2);
      return x.reshape({T, H * D}).narrow(begin, length).clone().reshape({1, length, H, D});
    };
    const Tensor q_d = part(q), k_d = part(k), v_d = part(v), dout_d = part(dout);
    Tensor out_d = Tensor::empty_like(q_d), lse_d = Tensor::empty({1, Hq, length});
    kernels::attention(q_d, k_d, v_d, scale, out_d, lse_d);
    Tensor dq_d = Tensor::empty_like(q_d), dk_d = Tensor::empty_like(k_d), dv_d = Tensor::empty_like(v_d);
    kernels::attention_backward(q_d, k_d, v_d, out_d, lse_d, dout_d, scale, dq_d, dk_d, dv_d);
    const std::string what = "document at " + std::to_string(begin);
    expect_close(part(out).to_vector<float>(), out_d.to_vector<float>(), 1e-5, 1e-6, "out " + what);
    expect_close(part(dq).to_vector<float>(), dq_d.to_vector<float>(), 1e-5, 1e-6, "dq " + what);
    expect_close(part(dk).to_vector<float>(), dk_d.to_vector<float>(), 1e-5, 1e-6, "dk " + what);
    expect_close(part(dv).to_vector<float>(), dv_d.to_vector<float>(), 1e-5, 1e-6, "dv " + what);
    begin += length;
  }
}

TEST(AttentionKernel, RejectsBadDocumentStarts) {
  const Tensor q = Tensor::zeros({1, 4, 2, 8}), k = Tensor::zeros({1, 4, 1, 8});
  Tensor out = Tensor::zeros({1, 4, 2, 8}), lse = Tensor::zeros({1, 2, 4});
  auto run = [&](const Tensor& starts) { kernels::attention(q, k, k, 1.0, out, lse, starts); };
  EXPECT_NO_THROW(run(Tensor::from_vector<int32_t>({1, 4}, {0, 0, 2, 3})));
  test::expect_error([&] { run(Tensor::from_vector<int32_t>({1, 4}, {0, 0, 1, 1})); }, {"doc_start[0, 2] = 1"});
  test::expect_error([&] { run(Tensor::from_vector<int32_t>({1, 4}, {1, 1, 1, 1})); }, {"doc_start[0, 0] = 1"});
  test::expect_error([&] { run(Tensor::from_vector<int32_t>({1, 4}, {0, 0, 0, 5})); }, {"doc_start[0, 3] = 5"});
  test::expect_error([&] { run(Tensor::from_vector<int32_t>({1, 3}, {0, 0, 0})); }, {"doc_start"});
  test::expect_error([&] { run(Tensor::from_vector<float>({1, 4}, {0, 0, 0, 0})); }, {"doc_start must be i32"});
}

// The kernels sum into their outputs while they still read their inputs: an output that shares memory
// with an input, or with another output, is one clear error rather than wrong numbers.
TEST(AttentionKernel, RejectsOutputsThatShareMemory) {
  Tensor q = Tensor::zeros({1, 4, 2, 8}), k = Tensor::zeros({1, 4, 2, 8}), v = Tensor::zeros({1, 4, 2, 8});
  Tensor out = Tensor::zeros({1, 4, 2, 8}), lse = Tensor::zeros({1, 2, 4});
  test::expect_error([&] { kernels::attention(q, k, v, 1.0, q, lse); }, {"attention: out overlaps q in memory"});
  // Overlapping in part: two views of one storage, elements 0..63 and 16..79.
  const Tensor storage = Tensor::zeros({8, 16});
  const Tensor q_view = storage.narrow(0, 4).reshape({1, 4, 2, 8});
  Tensor out_view = storage.narrow(1, 4).reshape({1, 4, 2, 8});
  test::expect_error([&] { kernels::attention(q_view, k, v, 1.0, out_view, lse); }, {"out overlaps q"});
  EXPECT_NO_THROW(kernels::attention(q, k, v, 1.0, out, lse));

  Tensor dq = Tensor::zeros({1, 4, 2, 8}), dk = Tensor::zeros({1, 4, 2, 8}), dv = Tensor::zeros({1, 4, 2, 8});
  test::expect_error([&] { kernels::attention_backward(q, k, v, out, lse, out, 1.0, dq, dk, dk); },
                     {"attention_backward: dk overlaps dv in memory"});
  test::expect_error([&] { kernels::attention_backward(q, k, v, out, lse, dq, 1.0, dq, dk, dv); },
                     {"attention_backward: dq overlaps dout in memory"});
  test::expect_error([&] { kernels::attention_backward(q, k, v, out, lse, out, 1.0, dq, v, dv); },
                     {"attention_backward: dk overlaps v in memory"});
  EXPECT_NO_THROW(kernels::attention_backward(q, k, v, out, lse, out, 1.0, dq, dk, dv));
}

TEST(AttentionKernel, BackwardIsBitIdenticalRunToRun) {
  const int saved_threads = num_threads();
  set_num_threads(2);
  const Dims n{1, 129, 4, 2, 17};
  const Tensor q = random_tensor({n.B, n.T, n.Hq, n.D}, 41), k = random_tensor({n.B, n.T, n.Hkv, n.D}, 42);
  const Tensor v = random_tensor({n.B, n.T, n.Hkv, n.D}, 43), dout = random_tensor({n.B, n.T, n.Hq, n.D}, 44);
  const double scale = 1.0 / std::sqrt(static_cast<double>(n.D));
  Tensor out = Tensor::empty_like(q), lse = Tensor::empty({n.B, n.Hq, n.T});
  kernels::attention(q, k, v, scale, out, lse);
  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    Tensor dq = Tensor::empty_like(q), dk = Tensor::empty_like(k), dv = Tensor::empty_like(v);
    kernels::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv);
    const std::vector<std::vector<float>> grads{dq.to_vector<float>(), dk.to_vector<float>(), dv.to_vector<float>()};
    if (run == 0) first = grads;
    else EXPECT_TRUE(grads == first) << "dq, dk or dv differ between two runs on 2 threads";
  }
  set_num_threads(saved_threads);
}

TEST(AttentionKernel, RejectsMismatchedShapes) {
  const Tensor q = Tensor::zeros({1, 4, 3, 8}), k = Tensor::zeros({1, 4, 2, 8}), k_short = Tensor::zeros({1, 3, 1, 8});
  const Tensor k_one = Tensor::zeros({1, 4, 1, 8});
  Tensor out = Tensor::zeros({1, 4, 3, 8}), lse = Tensor::zeros({1, 3, 4}), lse_wrong = Tensor::zeros({1, 4, 3});
  EXPECT_THROW(kernels::attention(q, k, k, 1.0, out, lse), Error);              // 3 query heads over 2 kv heads
  EXPECT_THROW(kernels::attention(q, k_short, k_short, 1.0, out, lse), Error);  // different T
  EXPECT_THROW(kernels::attention(q, k_one, k_one, 1.0, out, lse_wrong), Error);
  EXPECT_NO_THROW(kernels::attention(q, k_one, k_one, 1.0, out, lse));
}

// ---- attention over a fused QKV projection ------------------------------------------------------------

// qkv_attention turns q and k by RoPE as it gathers their blocks and writes its gradients into dqkv's
// columns, turned back there; it must give the bits of the split, attention, and their backwards in
// turn, whose values the tests above hold against the definitions.
template <class T>
void check_fused_against_parts(DType dtype, const Dims& n, int64_t pos_offset, const std::vector<int32_t>& doc_start) {
  const int64_t C = (n.Hq + 2 * n.Hkv) * n.D;
  const double theta = 10000.0, scale = 1.0 / std::sqrt(static_cast<double>(n.D));
  const std::string what = n.str() + " pos_offset=" + std::to_string(pos_offset) +
                           (doc_start.empty() ? "" : " packed") + " " + dtype_name(dtype);
  const Tensor qkv = random_tensor({n.B, n.T, C}, 61, dtype);
  const Tensor dout = random_tensor({n.B, n.T, n.Hq, n.D}, 62, dtype);
  const Tensor starts = doc_start.empty() ? Tensor() : Tensor::from_vector<int32_t>({n.B, n.T}, doc_start);

  Tensor q = Tensor::empty({n.B, n.T, n.Hq, n.D}, dtype), k = Tensor::empty({n.B, n.T, n.Hkv, n.D}, dtype);
  Tensor v = Tensor::empty_like(k), out = Tensor::empty_like(q), lse = Tensor::empty({n.B, n.Hq, n.T}, dtype);
  kernels::split_qkv_rope(qkv, theta, pos_offset, q, k, v);
  kernels::attention(q, k, v, scale, out, lse, starts);
  Tensor dq = Tensor::empty_like(q), dk = Tensor::empty_like(k), dv = Tensor::empty_like(v);
  kernels::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, starts);
  Tensor dqkv = Tensor::empty_like(qkv);
  kernels::split_qkv_rope_backward(dq, dk, dv, theta, pos_offset, dqkv);

  Tensor fused_out = Tensor::empty_like(out), fused_lse = Tensor::empty_like(lse);
  kernels::qkv_attention(qkv, n.Hq, n.Hkv, theta, pos_offset, scale, fused_out, fused_lse, starts);
  EXPECT_TRUE(fused_out.to_vector<T>() == out.to_vector<T>()) << "out " << what;
  EXPECT_TRUE(fused_lse.to_vector<T>() == lse.to_vector<T>()) << "lse " << what;
  Tensor fused_dqkv = Tensor::full(qkv.shape(), NAN, dtype);  // every element must be written
  kernels::qkv_attention_backward(qkv, n.Hq, n.Hkv, theta, pos_offset, out, lse, dout, scale, fused_dqkv, starts);
  EXPECT_TRUE(fused_dqkv.to_vector<T>() == dqkv.to_vector<T>()) << "dqkv " << what;
}

TEST(AttentionKernel, FusedQkvHasTheBitsOfTheSplitAndAttention) {
  const int saved_threads = num_threads();
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    for_each_cpu_target([] {
      // Head dims of one RoPE pair, of halves shorter than a vector, and of whole vectors; T across
      // several 64-row blocks.
      for (const Dims& n :
           {Dims{2, 129, 4, 2, 16}, Dims{1, 3, 3, 1, 2}, Dims{1, 70, 2, 2, 64}, Dims{2, 65, 1, 1, 34}}) {
        for (const int64_t pos_offset : {0, 7}) {
          check_fused_against_parts<float>(DType::F32, n, pos_offset, {});
          check_fused_against_parts<double>(DType::F64, n, pos_offset, {});
        }
        check_fused_against_parts<float>(DType::F32, n, 0, packed_starts(n.B, n.T, {1, 63, 64, 5, 100}));
        // The bf16 block products alike, on each tile unit (f32 where the target or the CPU has none).
        const test::MatmulPrecisionScope precision(kernels::MatmulPrecision::BF16Inputs);
        test::for_each_bf16_tile_unit([&](const char* unit) {
          SCOPED_TRACE(unit);
          check_fused_against_parts<float>(DType::F32, n, 7, {});
          check_fused_against_parts<float>(DType::F32, n, 0, packed_starts(n.B, n.T, {1, 63, 64, 5, 100}));
        });
      }
    });
  }
  set_num_threads(saved_threads);
}

TEST(AttentionKernel, FusedQkvRejectsBadArguments) {
  const Tensor qkv = Tensor::zeros({1, 4, 4 * 8});  // Hq 2, Hkv 1, D 8
  Tensor out = Tensor::zeros({1, 4, 2, 8}), lse = Tensor::zeros({1, 2, 4}), dqkv = Tensor::zeros({1, 4, 32});
  EXPECT_NO_THROW(kernels::qkv_attention(qkv, 2, 1, 10000.0, 0, 1.0, out, lse));
  EXPECT_NO_THROW(kernels::qkv_attention_backward(qkv, 2, 1, 10000.0, 0, out, lse, out.clone(), 1.0, dqkv));
  test::expect_error([&] { kernels::qkv_attention(qkv, 3, 1, 10000.0, 0, 1.0, out, lse); },
                     {"qkv_attention: qkv f32[1, 4, 32] cpu", "is not [B, T, (3 + 2 * 1) * head_dim]"});
  test::expect_error([&] { kernels::qkv_attention(qkv, 3, 2, 10000.0, 0, 1.0, out, lse); },
                     {"query heads (3) must be a positive multiple of kv heads (2)"});
  const Tensor odd = Tensor::zeros({1, 4, 4 * 3});
  Tensor odd_out = Tensor::zeros({1, 4, 2, 3});
  test::expect_error([&] { kernels::qkv_attention(odd, 2, 1, 10000.0, 0, 1.0, odd_out, lse); },
                     {"head dim must be positive and even for RoPE, got 3"});
  test::expect_error([&] { kernels::qkv_attention(qkv, 2, 1, 10000.0, -1, 1.0, out, lse); }, {"pos_offset >= 0"});
  Tensor wrong_out = Tensor::zeros({1, 4, 1, 8});
  test::expect_error([&] { kernels::qkv_attention(qkv, 2, 1, 10000.0, 0, 1.0, wrong_out, lse); }, {"out"});
  Tensor wrong_lse = Tensor::zeros({1, 4, 2});
  test::expect_error([&] { kernels::qkv_attention(qkv, 2, 1, 10000.0, 0, 1.0, out, wrong_lse); }, {"lse"});
  test::expect_error(
      [&] {
        kernels::qkv_attention(qkv, 2, 1, 10000.0, 0, 1.0, out, lse, Tensor::zeros({1, 3}));
      },
      {"doc_start"});
  Tensor aliased = qkv;
  test::expect_error(
      [&] { kernels::qkv_attention_backward(qkv, 2, 1, 10000.0, 0, out, lse, out.clone(), 1.0, aliased); },
      {"qkv_attention_backward: dqkv overlaps qkv in memory"});
  Tensor short_dqkv = Tensor::zeros({1, 4, 16});
  test::expect_error(
      [&] { kernels::qkv_attention_backward(qkv, 2, 1, 10000.0, 0, out, lse, out.clone(), 1.0, short_dqkv); },
      {"dqkv"});
}

// Rows of different lengths decoded together (a batch of ragged sequences): each row's output is the
// bits it gets decoded alone, in a batch of one with its own length, on every CPU target. Its accuracy is
// checked against the plain loops of the CUDA kernel (CudaEmulation.AttentionDecodeMatchesTheCpuKernel).
TEST(AttentionDecode, RaggedRowsMatchEachRowAlone) {
  auto values = [](const Tensor& t) { return t.to(DType::F64).to_vector<double>(); };
  for_each_cpu_target([&] {
    for (DType dtype : {DType::F32, DType::F64}) {
      const int64_t B = 4, Tq = 2, Hq = 4, Hkv = 2, D = 40, capacity = 40;  // D: full vectors and a tail
      const std::vector<int64_t> Tk_B = {2, 40, 17, 5};
      const Tensor q = random_tensor({B, Tq, Hq, D}, 71, dtype);
      const Tensor k = random_tensor({B, capacity, Hkv, D}, 72, dtype);
      const Tensor v = random_tensor({B, capacity, Hkv, D}, 73, dtype);
      Tensor out = Tensor::empty(q.shape(), dtype);
      kernels::attention_decode(q, k, v, Tk_B, 0.3, out);
      for (int64_t b = 0; b < B; ++b) {
        Tensor alone = Tensor::empty({1, Tq, Hq, D}, dtype);
        kernels::attention_decode(q.narrow(b, 1), k.narrow(b, 1), v.narrow(b, 1), {Tk_B[b]}, 0.3, alone);
        EXPECT_EQ(values(out.narrow(b, 1)), values(alone)) << dtype_name(dtype) << " row " << b;
      }
    }
  });
}


// ---- bf16 block products (--dtype bf16) -----------------------------------------------------------------

// Under mixed precision on a CPU with AVX512_BF16 the block products multiply bf16 operands with f32 sums
// (tensor/cpu/attention.cc, "bf16 block products"): q, k, v and dout rounded to bf16, P and dS rounded
// as operands of the second products. Against the double reference on the rounded inputs what is left is
// the rounding of P and dS (2^-9 relative each); against the f32 kernel on the inputs as they are, the
// inputs' rounding too. The bounds, on every element, relative to the largest magnitude of its tensor in
// the reference (or 10^-3, where a gradient is all but zero: T = 1), are twice the largest error seen
// over these shapes (0.0035 and 0.0074).
constexpr double kBoundOnRoundedInputs = 1.0 / 128;
constexpr double kBoundAgainstF32 = 1.0 / 64;

std::vector<double> rounded_to_bf16(const Tensor& x) { return to_double<float>(x.to(DType::BF16).to(DType::F32)); }

// The largest |actual - expected| over the largest |reference| (at least 10^-3).
template <class E>
double relative_error(const std::vector<float>& actual, const std::vector<E>& expected,
                      const std::vector<double>& reference) {
  double worst = 0, largest = 1e-3;
  for (size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(actual[i]) - static_cast<double>(expected[i])));
    largest = std::max(largest, std::abs(reference[i]));
  }
  return worst / largest;
}

struct AttentionResults {
  std::vector<float> out, lse, dq, dk, dv;
};

AttentionResults run_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, double scale,
                               const Tensor& starts) {
  Tensor out = Tensor::empty_like(q), lse = Tensor::empty({q.dim(0), q.dim(2), q.dim(1)});
  kernels::attention(q, k, v, scale, out, lse, starts);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor dq = Tensor::full(q.shape(), nan), dk = Tensor::full(k.shape(), nan), dv = Tensor::full(k.shape(), nan);
  kernels::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, starts);
  return {out.to_vector<float>(), lse.to_vector<float>(), dq.to_vector<float>(), dk.to_vector<float>(),
          dv.to_vector<float>()};
}

void check_bf16_attention(const Dims& n, const std::vector<int32_t>& doc_start = {}) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(n.D));
  const Tensor q = random_tensor({n.B, n.T, n.Hq, n.D}, 71), k = random_tensor({n.B, n.T, n.Hkv, n.D}, 72);
  const Tensor v = random_tensor({n.B, n.T, n.Hkv, n.D}, 73), dout = random_tensor({n.B, n.T, n.Hq, n.D}, 74);
  const Tensor starts = doc_start.empty() ? Tensor() : Tensor::from_vector<int32_t>({n.B, n.T}, doc_start);
  const auto rounded = reference_attention(n, rounded_to_bf16(q), rounded_to_bf16(k), rounded_to_bf16(v),
                                           rounded_to_bf16(dout), scale, doc_start);
  const AttentionResults f32 = run_attention(q, k, v, dout, scale, starts);
  AttentionResults bf16;
  {
    const test::MatmulPrecisionScope precision(kernels::MatmulPrecision::BF16Inputs);
    bf16 = run_attention(q, k, v, dout, scale, starts);
  }
  const std::string what = n.str() + (doc_start.empty() ? "" : " packed");
  const std::vector<std::pair<const char*, std::pair<const std::vector<float>*, const std::vector<float>*>>> pairs = {
      {"out", {&bf16.out, &f32.out}}, {"lse", {&bf16.lse, &f32.lse}}, {"dq", {&bf16.dq, &f32.dq}},
      {"dk", {&bf16.dk, &f32.dk}},    {"dv", {&bf16.dv, &f32.dv}}};
  const std::vector<const std::vector<double>*> references = {&rounded.out, &rounded.lse, &rounded.dq, &rounded.dk,
                                                              &rounded.dv};
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto& [name, results] = pairs[i];
    EXPECT_LE(relative_error(*results.first, *references[i], *references[i]), kBoundOnRoundedInputs)
        << name << " " << what;
    EXPECT_LE(relative_error(*results.first, *results.second, *references[i]), kBoundAgainstF32) << name << " " << what;
  }
}

// On VDPBF16PS, on the AMX blocking with emulated tiles, and on the tiles where the CPU has them.
TEST(AttentionKernel, Bf16ProductsMatchTheReferenceWithinTheirBound) {
  if (!cpu::bf16_matmul_available()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  test::for_each_bf16_tile_unit([](const char* unit) {
    SCOPED_TRACE(unit);
    for (const Dims& n : attention_sizes()) check_bf16_attention(n);
    for (const Dims& n : {Dims{2, 200, 4, 2, 17}, Dims{1, 129, 3, 1, 64}, Dims{1, 70, 2, 1, 130}})
      check_bf16_attention(n, packed_starts(n.B, n.T, {1, 63, 64, 5, 100}));
  });
}

void check_bf16_attention_bits(const Dims& n) {
  const double scale = 0.125;
  const Tensor q = random_tensor({n.B, n.T, n.Hq, n.D}, 81), k = random_tensor({n.B, n.T, n.Hkv, n.D}, 82);
  const Tensor v = random_tensor({n.B, n.T, n.Hkv, n.D}, 83), dout = random_tensor({n.B, n.T, n.Hq, n.D}, 84);
  auto round = [](const Tensor& x) { return x.to(DType::BF16).to(DType::F32); };
  const AttentionResults f32_on_rounded = run_attention(round(q), round(k), round(v), round(dout), scale, Tensor());
  const test::MatmulPrecisionScope precision(kernels::MatmulPrecision::BF16Inputs);
  const int saved_threads = num_threads();
  std::vector<AttentionResults> runs;
  for (const int threads : {1, 2, 2}) {
    set_num_threads(threads);
    runs.push_back(run_attention(q, k, v, dout, scale, Tensor()));
  }
  set_num_threads(saved_threads);
  EXPECT_NE(runs[0].out, f32_on_rounded.out);
  EXPECT_NE(runs[0].dq, f32_on_rounded.dq);
  for (size_t r = 1; r < runs.size(); ++r) {
    EXPECT_TRUE(runs[r].out == runs[0].out && runs[r].lse == runs[0].lse) << "forward, run " << r;
    EXPECT_TRUE(runs[r].dq == runs[0].dq && runs[r].dk == runs[0].dk && runs[r].dv == runs[0].dv)
        << "backward, run " << r;
  }
}

// The bf16 products are not the f32 kernel on rounded inputs (P and dS are rounded too), and their bits
// do not depend on the thread count, run after run.
TEST(AttentionKernel, Bf16ProductsAreTheirOwnAndBitIdenticalOnAnyThreadCount) {
  if (!cpu::bf16_matmul_available()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  test::for_each_bf16_tile_unit([](const char* unit) {
    SCOPED_TRACE(unit);
    check_bf16_attention_bits({2, 129, 4, 2, 64});
  });
}

// Under mixed precision the fused forward writes the bf16 copies autograd keeps of qkv and out (every
// element once, convert's rounding, out and lse unchanged), and the backward takes the copies of q, k, v
// and out, or of qkv and out (autograd/saved.h), widening them as it reads them: the bits of the backward
// on the widened copies, split and fused (RoPE at an offset), with GQA and packed documents.
void check_kept_bf16_copies(const Dims& n, const std::vector<int32_t>& doc_start) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(n.D)), nan = std::numeric_limits<double>::quiet_NaN();
  const std::string what = n.str() + (doc_start.empty() ? "" : " packed");
  const Tensor starts = doc_start.empty() ? Tensor() : Tensor::from_vector<int32_t>({n.B, n.T}, doc_start);
  const auto widened = [](const Tensor& t) { return t.to(DType::F32); };
  const Tensor dout = random_tensor({n.B, n.T, n.Hq, n.D}, 94);
  Tensor out = Tensor::empty({n.B, n.T, n.Hq, n.D}), lse = Tensor::empty({n.B, n.Hq, n.T});

  const Tensor q16 = random_tensor({n.B, n.T, n.Hq, n.D}, 91).to(DType::BF16);
  const Tensor k16 = random_tensor({n.B, n.T, n.Hkv, n.D}, 92).to(DType::BF16);
  const Tensor v16 = random_tensor({n.B, n.T, n.Hkv, n.D}, 93).to(DType::BF16);
  kernels::attention(widened(q16), widened(k16), widened(v16), scale, out, lse, starts);
  const Tensor out16 = out.to(DType::BF16);
  const auto split = [&](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o) {
    Tensor dq = Tensor::full(q.shape(), nan), dk = Tensor::full(k.shape(), nan), dv = Tensor::full(k.shape(), nan);
    kernels::attention_backward(q, k, v, o, lse, dout, scale, dq, dk, dv, starts);
    return std::vector{dq.to_vector<float>(), dk.to_vector<float>(), dv.to_vector<float>()};
  };
  EXPECT_TRUE(split(q16, k16, v16, out16) == split(widened(q16), widened(k16), widened(v16), widened(out16)))
      << "split " << what;

  const double theta = 10000.0;
  const int64_t pos_offset = 7;
  const Tensor qkv = random_tensor({n.B, n.T, (n.Hq + 2 * n.Hkv) * n.D}, 96);
  Tensor plain_out = Tensor::empty_like(out), plain_lse = Tensor::empty_like(lse);
  kernels::qkv_attention(qkv, n.Hq, n.Hkv, theta, pos_offset, scale, plain_out, plain_lse, starts);
  Tensor qkv_copy = Tensor::full(qkv.shape(), nan, DType::BF16), out_copy = Tensor::full(out.shape(), nan, DType::BF16);
  kernels::qkv_attention(qkv, n.Hq, n.Hkv, theta, pos_offset, scale, out, lse, starts, qkv_copy, out_copy);
  EXPECT_TRUE(out.to_vector<float>() == plain_out.to_vector<float>() &&
              lse.to_vector<float>() == plain_lse.to_vector<float>())
      << "forward " << what;
  const auto same_bits = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
  };
  EXPECT_TRUE(same_bits(qkv_copy, qkv.to(DType::BF16))) << "qkv's copy " << what;
  EXPECT_TRUE(same_bits(out_copy, out.to(DType::BF16))) << "out's copy " << what;

  const Tensor qkv16 = random_tensor({n.B, n.T, (n.Hq + 2 * n.Hkv) * n.D}, 95).to(DType::BF16);
  kernels::qkv_attention(widened(qkv16), n.Hq, n.Hkv, theta, pos_offset, scale, out, lse, starts);
  const Tensor fused_out16 = out.to(DType::BF16);
  const auto fused = [&](const Tensor& qkv, const Tensor& o) {
    Tensor dqkv = Tensor::full(qkv.shape(), nan);
    kernels::qkv_attention_backward(qkv, n.Hq, n.Hkv, theta, pos_offset, o, lse, dout, scale, dqkv, starts);
    return dqkv.to_vector<float>();
  };
  EXPECT_TRUE(fused(qkv16, fused_out16) == fused(widened(qkv16), widened(fused_out16))) << "fused " << what;
  // One element type for all four on a CPU.
  Tensor dqkv = Tensor::empty(qkv16.shape());
  EXPECT_THROW(kernels::qkv_attention_backward(qkv16, n.Hq, n.Hkv, theta, pos_offset, widened(fused_out16), lse, dout,
                                               scale, dqkv, starts),
               Error);
}

// On every target, with the bf16 block products on each tile unit and without them.
TEST(AttentionKernel, KeptBf16CopiesAreConvertsAndGiveTheBitsOfTheirWidenedValues) {
  const test::MatmulPrecisionScope precision(kernels::MatmulPrecision::BF16Inputs);
  for_each_cpu_target([] {
    test::for_each_bf16_tile_unit([](const char* unit) {
      SCOPED_TRACE(unit);
      for (const Dims& n : {Dims{2, 129, 4, 2, 16}, Dims{1, 70, 2, 2, 64}, Dims{1, 65, 3, 1, 34}}) {
        check_kept_bf16_copies(n, {});
        check_kept_bf16_copies(n, packed_starts(n.B, n.T, {1, 63, 64, 5, 100}));
      }
    });
  });
}

}  // namespace
}  // namespace lt
