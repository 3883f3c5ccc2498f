// Attention for generation with a KV cache: the newest Tq queries of each row against its Tk_B[b] cached
// positions. Inference only (no lse, no backward); one (batch, query head, query row) per work item, so a
// row's output is the same whatever other rows are decoded with it.
//
// Numerics: a score is the dot product in the input dtype, summed in vectors across the head dimension
// and then across the lanes: in f32 for 16 (AVX-512; 8 on AVX2) keys at once through TransposedSums, the
// keys after the last such group four at a time by SumOfLanes, so a key's sum depends on its index and the
// row's length only; the softmax is shifted by the
// row maximum and exponentiated in vectors (ExpNonPositive, tensor/cpu/exp-inl.h: within 8.7e-8 of exp);
// out = sum_j weight_j v_j in the input dtype, in key order. Decoding is dominated by this kernel once
// the rows are batched (the GEMMs then share their weights across rows; attention reads each row's own
// cache), hence the vectors everywhere.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/attention_decode.cc"
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/exp-inl.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The f32 targets whose lanes TransposedSums adds: 4 per 128-bit block, 1, 2 or 4 blocks.
#if HWY_TARGET <= HWY_AVX3
constexpr int64_t kTransposedSumLanes = 16;
#elif HWY_TARGET == HWY_AVX2
constexpr int64_t kTransposedSumLanes = 8;
#elif HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3
constexpr int64_t kTransposedSumLanes = 4;
#else
constexpr int64_t kTransposedSumLanes = 0;  // scores go key by key (SumOfLanes)
#endif

// One vector whose lane j is the sum of the lanes of acc[j], for as many f32 vectors as a vector has lanes:
// a tree of shuffles and adds, ~3 instructions a vector, where reducing each alone (SumOfLanes) takes ~8.
// Within each 128-bit block, lanes are added in pairs (lane i with i + 2, then the two halves), which
// leaves each vector's per-block sums side by side; then the blocks are added. The same order every call.
#if HWY_TARGET != HWY_SCALAR
template <class D, class V>
HWY_INLINE V TransposedSums(D d, V* acc) {
  const hn::Repartition<uint64_t, D> d64;
  constexpr int64_t L = kTransposedSumLanes;
  V pair[L / 2];
  for (int64_t i = 0; i < L / 2; ++i)
    pair[i] = hn::Add(hn::InterleaveLower(d, acc[2 * i], acc[2 * i + 1]),
                      hn::InterleaveUpper(d, acc[2 * i], acc[2 * i + 1]));
  // quad[i], block b: the sums of block b of acc[4i .. 4i + 3].
  V quad[L / 4];
  for (int64_t i = 0; i < L / 4; ++i) {
    const auto lo = hn::BitCast(d64, pair[2 * i]), hi = hn::BitCast(d64, pair[2 * i + 1]);
    quad[i] = hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, lo, hi)),
                      hn::BitCast(d, hn::InterleaveUpper(d64, lo, hi)));
  }
  if constexpr (L == 4) {
    return quad[0];
  } else if constexpr (L == 8) {
    return hn::Add(hn::ConcatLowerLower(d, quad[1], quad[0]), hn::ConcatUpperUpper(d, quad[1], quad[0]));
  } else {
    // Blocks 0 + 1 and 2 + 3 of each quad, then two quads' side by side, then the halves.
    for (V& v : quad) v = hn::Add(v, hn::SwapAdjacentBlocks(v));
    const V first = hn::OddEvenBlocks(quad[1], quad[0]), second = hn::OddEvenBlocks(quad[3], quad[2]);
    return hn::Add(hn::ConcatLowerLower(d, second, first), hn::ConcatUpperUpper(d, second, first));
  }
}
#endif

// scores[j] = scale * q . k_j for keys j = 0 .. n - 1, key j at k + j * key_stride.
template <class T>
HWY_INLINE void KeyScores(const T* q, const T* k, int64_t key_stride, int64_t n, int64_t D, T scale, T* scores) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), full = D - D % lanes;
  auto finish = [&](auto acc, const T* kj) {
    T dot = hn::GetLane(hn::SumOfLanes(d, acc));
    for (int64_t e = full; e < D; ++e) dot += q[e] * kj[e];
    return dot * scale;
  };
  int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, float> && kTransposedSumLanes > 0) {
    // A key's score in one lane of a vector of kTransposedSumLanes keys' scores: the keys' products
    // summed across the head dimension in vectors, then across the lanes in TransposedSums; the k's past
    // the last whole vector are added after, in order.
    constexpr int64_t L = kTransposedSumLanes;
    HWY_ALIGN T rest[L];
    for (; j + L <= n; j += L) {
      const T* kj = k + j * key_stride;
      hn::Vec<decltype(d)> acc[L];
      for (auto& a : acc) a = hn::Zero(d);
      for (int64_t e = 0; e < full; e += lanes) {
        const auto qe = hn::LoadU(d, q + e);
        for (int64_t i = 0; i < L; ++i) acc[i] = hn::MulAdd(qe, hn::LoadU(d, kj + i * key_stride + e), acc[i]);
      }
      auto dots = TransposedSums(d, acc);
      if (full < D) {
        for (int64_t i = 0; i < L; ++i) {
          rest[i] = 0;
          for (int64_t e = full; e < D; ++e) rest[i] += q[e] * kj[i * key_stride + e];
        }
        dots = hn::Add(dots, hn::Load(d, rest));
      }
      hn::StoreU(hn::Mul(dots, hn::Set(d, scale)), d, scores + j);
    }
  }
#endif
  for (; j + 4 <= n; j += 4) {
    const T* k0 = k + j * key_stride;
    const T *k1 = k0 + key_stride, *k2 = k1 + key_stride, *k3 = k2 + key_stride;
    auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    for (int64_t e = 0; e < full; e += lanes) {
      const auto qe = hn::LoadU(d, q + e);
      a0 = hn::MulAdd(qe, hn::LoadU(d, k0 + e), a0);
      a1 = hn::MulAdd(qe, hn::LoadU(d, k1 + e), a1);
      a2 = hn::MulAdd(qe, hn::LoadU(d, k2 + e), a2);
      a3 = hn::MulAdd(qe, hn::LoadU(d, k3 + e), a3);
    }
    scores[j] = finish(a0, k0);
    scores[j + 1] = finish(a1, k1);
    scores[j + 2] = finish(a2, k2);
    scores[j + 3] = finish(a3, k3);
  }
  for (; j < n; ++j) {
    const T* kj = k + j * key_stride;
    auto acc = hn::Zero(d);
    for (int64_t e = 0; e < full; e += lanes) acc = hn::MulAdd(hn::LoadU(d, q + e), hn::LoadU(d, kj + e), acc);
    scores[j] = finish(acc, kj);
  }
}

// The softmax of scores[0, n) in place; scores has room for whole vectors past n (overwritten).
template <class T>
HWY_INLINE void SoftmaxInPlace(T* scores, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), padded = (n + lanes - 1) / lanes * lanes;
  const T max_score = *std::max_element(scores, scores + n);
  std::fill(scores + n, scores + padded, -std::numeric_limits<T>::infinity());  // exp gives 0 there
  const auto shift = hn::Set(d, max_score);
  auto total = hn::Zero(d);
  for (int64_t j = 0; j < padded; j += lanes) {
    const auto e = ExpNonPositive(d, hn::Sub(hn::LoadU(d, scores + j), shift));
    hn::StoreU(e, d, scores + j);
    total = hn::Add(total, e);
  }
  const auto inverse = hn::Set(d, static_cast<T>(1) / hn::GetLane(hn::SumOfLanes(d, total)));
  for (int64_t j = 0; j < padded; j += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, scores + j), inverse), d, scores + j);
}

// out = sum_j weights[j] v_j over keys j = 0 .. n - 1, value j at v + j * key_stride: two vectors of
// columns per pass, so that two sums are in flight.
template <class T>
HWY_INLINE void WeightedValues(const T* weights, const T* v, int64_t key_stride, int64_t n, int64_t D, T* out) {
  const hn::ScalableTag<T> dt;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dt));
  int64_t d = 0;
  for (; d + 2 * lanes <= D; d += 2 * lanes) {
    auto acc0 = hn::Zero(dt), acc1 = hn::Zero(dt);
    for (int64_t j = 0; j < n; ++j) {
      const auto weight = hn::Set(dt, weights[j]);
      acc0 = hn::MulAdd(weight, hn::LoadU(dt, v + j * key_stride + d), acc0);
      acc1 = hn::MulAdd(weight, hn::LoadU(dt, v + j * key_stride + d + lanes), acc1);
    }
    hn::StoreU(acc0, dt, out + d);
    hn::StoreU(acc1, dt, out + d + lanes);
  }
  for (; d + lanes <= D; d += lanes) {
    auto acc = hn::Zero(dt);
    for (int64_t j = 0; j < n; ++j)
      acc = hn::MulAdd(hn::Set(dt, weights[j]), hn::LoadU(dt, v + j * key_stride + d), acc);
    hn::StoreU(acc, dt, out + d);
  }
  for (; d < D; ++d) {
    T acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += weights[j] * v[j * key_stride + d];
    out[d] = acc;
  }
}

// q [B, Tq, Hq, D]; k, v [B, capacity, Hkv, D]; out like q. shape: B, Tq, Hq, D, capacity, Hkv.
template <class T>
void AttentionDecodeT(const T* q, const T* k, const T* v, const int64_t* Tk_B, double scale, const int64_t* shape,
                      T* out) {
  const int64_t B = shape[0], Tq = shape[1], Hq = shape[2], D = shape[3], capacity = shape[4], Hkv = shape[5];
  const int64_t group = Hq / Hkv, key_stride = Hkv * D;
  const int64_t max_Tk = *std::max_element(Tk_B, Tk_B + B);
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<T>()));
  // Four FLOPs per key and dimension (score and weighted value): a few rows' heads are less work than
  // waking a pool worker (kMinFlopsPerPiece), and stay on the calling thread.
  const int64_t grain = grain_for_flops(4.0 * static_cast<double>(max_Tk * D));
  parallel_for(B * Hq * Tq, grain, [&](int64_t begin, int64_t end) {
    std::vector<T> weights(static_cast<size_t>((max_Tk + lanes - 1) / lanes * lanes));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (Hq * Tq), h = (item / Tq) % Hq, i = item % Tq;
      const int64_t keys = Tk_B[b] - Tq + i + 1;  // this query sits at position keys - 1: it sees keys 0 .. keys - 1
      const int64_t kv_offset = (b * capacity * Hkv + h / group) * D;
      KeyScores(q + ((b * Tq + i) * Hq + h) * D, k + kv_offset, key_stride, keys, D, static_cast<T>(scale),
                weights.data());
      SoftmaxInPlace(weights.data(), keys);
      WeightedValues(weights.data(), v + kv_offset, key_stride, keys, D, out + ((b * Tq + i) * Hq + h) * D);
    }
  });
}

void AttentionDecodeKernel(DType dtype, const void* q, const void* k, const void* v, const int64_t* Tk_B, double scale,
                           const int64_t* shape, void* out) {
  LT_FLOAT_SWITCH(dtype, T, {
    AttentionDecodeT<T>(static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), Tk_B, scale,
                        shape, static_cast<T*>(out));
  });
}

}  // namespace lt::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace lt::cpu {
HWY_EXPORT(AttentionDecodeKernel);

void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& Tk_B, double scale,
                      Tensor& out) {
  if (q.numel() == 0) return;
  const int64_t shape[6] = {q.dim(0), q.dim(1), q.dim(2), q.dim(3), k.dim(1), k.dim(2)};
  HWY_DYNAMIC_DISPATCH(AttentionDecodeKernel)(q.dtype(), q.raw_data(), k.raw_data(), v.raw_data(), Tk_B.data(), scale,
                                              shape, out.raw_data());
}

}  // namespace lt::cpu
#endif  // HWY_ONCE
