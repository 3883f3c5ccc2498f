// Attention for generation with a KV cache: the newest Tq queries of each row against its Tk_B[b] cached
// positions. Inference only (no lse, no backward); one (batch, query head, query row) per work item, so a
// row's output is the same whatever other rows are decoded with it.
//
// Numerics: a score is the dot product in f64 (the products of f32 inputs are exact there), summed in
// vectors across the head dimension and then across the lanes; the softmax is shifted by the row maximum,
// with std::exp; out = sum_j weight_j v_j in the input dtype, in key order. Decoding is dominated by this
// kernel once the rows are batched (the GEMMs then share their weights across rows; attention reads each
// row's own cache), hence the vectors.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tensor/cpu/attention_decode.cc"
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

HWY_BEFORE_NAMESPACE();
namespace lt::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// lanes values of type T at p, widened to f64.
template <class DD, class T>
HWY_INLINE hn::Vec<DD> LoadAsDouble(DD dd, const T* p) {
  if constexpr (std::is_same_v<T, double>) {
    return hn::LoadU(dd, p);
  } else {
    return hn::PromoteTo(dd, hn::LoadU(hn::Rebind<T, DD>(), p));
  }
}

// scores[j] = scale * q . k_j for keys j = 0 .. n - 1, key j at k + j * key_stride; q_f64 is q in f64.
template <class T>
HWY_INLINE void KeyScores(const double* q_f64, const T* k, int64_t key_stride, int64_t n, int64_t D, double scale,
                          double* scores) {
  const hn::ScalableTag<double> dd;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd)), full = D - D % lanes;
  for (int64_t j = 0; j < n; ++j) {
    const T* kj = k + j * key_stride;
    auto acc = hn::Zero(dd);
    for (int64_t d = 0; d < full; d += lanes) acc = hn::MulAdd(hn::LoadU(dd, q_f64 + d), LoadAsDouble(dd, kj + d), acc);
    double dot = hn::GetLane(hn::SumOfLanes(dd, acc));
    for (int64_t d = full; d < D; ++d) dot += q_f64[d] * static_cast<double>(kj[d]);
    scores[j] = dot * scale;
  }
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
  parallel_for(B * Hq * Tq, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(static_cast<size_t>(max_Tk)), q_f64(static_cast<size_t>(D));
    std::vector<T> weights(static_cast<size_t>(max_Tk));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / (Hq * Tq), h = (item / Tq) % Hq, i = item % Tq;
      const int64_t keys = Tk_B[b] - Tq + i + 1;  // this query sits at position keys - 1: it sees keys 0 .. keys - 1
      const int64_t kv_offset = (b * capacity * Hkv + h / group) * D;
      const T* qi = q + ((b * Tq + i) * Hq + h) * D;
      std::copy(qi, qi + D, q_f64.begin());
      KeyScores(q_f64.data(), k + kv_offset, key_stride, keys, D, scale, scores.data());
      const double max_score = *std::max_element(scores.begin(), scores.begin() + keys);
      double total = 0;
      for (int64_t j = 0; j < keys; ++j) total += scores[j] = std::exp(scores[j] - max_score);
      for (int64_t j = 0; j < keys; ++j) weights[j] = static_cast<T>(scores[j] / total);
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
