// Attention for generation with a KV cache: the newest Tq queries of each row against its Tk_B[b] cached
// positions.
// Inference only (no lse, no backward); one (batch, query head, query row) per work item.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

namespace lt::cpu {

void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& Tk_B, double scale,
                      Tensor& out) {
  const int64_t B = q.dim(0), Tq = q.dim(1), Hq = q.dim(2), D = q.dim(3);
  const int64_t capacity = k.dim(1), Hkv = k.dim(2);
  const int64_t group = Hq / Hkv;
  const int64_t max_Tk = Tk_B.empty() ? 0 : *std::max_element(Tk_B.begin(), Tk_B.end());
  LT_FLOAT_SWITCH(q.dtype(), T, {
    const T* pq = q.data<T>();
    const T* pk = k.data<T>();
    const T* pv = v.data<T>();
    T* po = out.data<T>();
    parallel_for(B * Hq * Tq, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> scores(static_cast<size_t>(max_Tk));
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = item / (Hq * Tq), h = (item / Tq) % Hq, i = item % Tq;
        const int64_t last = Tk_B[b] - Tq + i;  // this query's position: it sees keys 0 .. last
        const int64_t kv_head = h / group;
        const T* qi = pq + ((b * Tq + i) * Hq + h) * D;
        double max_score = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) {
          const T* kj = pk + ((b * capacity + j) * Hkv + kv_head) * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double total = 0;
        for (int64_t j = 0; j <= last; ++j) total += scores[j] = std::exp(scores[j] - max_score);
        T* oi = po + ((b * Tq + i) * Hq + h) * D;
        for (int64_t d = 0; d < D; ++d) oi[d] = 0;
        for (int64_t j = 0; j <= last; ++j) {
          const T* vj = pv + ((b * capacity + j) * Hkv + kv_head) * D;
          const T weight = static_cast<T>(scores[j] / total);
          for (int64_t d = 0; d < D; ++d) oi[d] += weight * vj[d];
        }
      }
    });
  });
}

}  // namespace lt::cpu
