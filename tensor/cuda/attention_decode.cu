// Attention for generation with a KV cache on the GPU: the newest Tq queries of each row against its
// Tk_B[b] cached positions, with the CPU kernel's numerics (tensor/cpu/attention_decode.cc; its dot
// products summed in another order): scores in f64, the softmax shifted by the row maximum, then
// out = sum_j weight_j v_j in key order. One block per
// (batch, query head, query row); its threads share out the keys for the scores (kept in a scratch row
// of max_Tk doubles) and the head's columns for the output. Inference only: no lse, no backward.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/block_reduce.h"
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

struct DecodeDims {
  int64_t B, Tq, Hq, D, capacity, Hkv, max_Tk;
};

template <class T>
__global__ void attention_decode_kernel(const T* q, const T* k, const T* v, const int64_t* Tk_B, double scale,
                                        DecodeDims s, double* scores_ITk, T* out) {
  const int64_t items = s.B * s.Hq * s.Tq;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t b = item / (s.Hq * s.Tq), h = (item / s.Tq) % s.Hq, i = item % s.Tq;
    const int64_t last = Tk_B[b] - s.Tq + i;  // this query's position: it sees keys 0 .. last
    const int64_t kv_head = h / (s.Hq / s.Hkv);
    const T* qi = q + ((b * s.Tq + i) * s.Hq + h) * s.D;
    double* scores = scores_ITk + item * s.max_Tk;
    double local_max = -INFINITY;
    for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) {
      const T* kj = k + ((b * s.capacity + j) * s.Hkv + kv_head) * s.D;
      double dot = 0;
      for (int64_t d = 0; d < s.D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
      scores[j] = dot * scale;
      local_max = local_max > scores[j] ? local_max : scores[j];
    }
    const double max_score = block_max(local_max);
    double local_total = 0;
    for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) local_total += scores[j] = exp(scores[j] - max_score);
    const double total = block_sum(local_total);  // its barriers also publish every thread's scores
    T* oi = out + ((b * s.Tq + i) * s.Hq + h) * s.D;
    for (int64_t d = threadIdx.x; d < s.D; d += blockDim.x) {
      T acc = 0;
      for (int64_t j = 0; j <= last; ++j)
        acc += static_cast<T>(scores[j] / total) * v[((b * s.capacity + j) * s.Hkv + kv_head) * s.D + d];
      oi[d] = acc;
    }
    __syncthreads();  // every thread is done with the scores row before the next item's block reductions
  }
}

}  // namespace

void attention_decode(const Tensor& q, const Tensor& k, const Tensor& v, const std::vector<int64_t>& Tk_B, double scale,
                      Tensor& out) {
  const int64_t items = q.dim(0) * q.dim(2) * q.dim(1);
  if (items == 0) return;
  const int64_t max_Tk = *std::max_element(Tk_B.begin(), Tk_B.end());
  const DecodeDims s{q.dim(0), q.dim(1), q.dim(2), q.dim(3), k.dim(1), k.dim(2), max_Tk};
  const DeviceGuard guard(q.device().index);
  // One small host-to-device copy per call (B lengths): a layer's decode step reads them once.
  const Tensor lengths_B = Tensor::from_vector<int64_t>({s.B}, Tk_B).to(q.device());
  Tensor scores = Tensor::empty({items, max_Tk}, DType::F64, q.device());
  LT_FLOAT_SWITCH(q.dtype(), T, {
    LT_CUDA_LAUNCH(row_blocks(items), kRowThreads, attention_decode_kernel<T>)(
        q.data<T>(), k.data<T>(), v.data<T>(), lengths_B.data<int64_t>(), scale, s, scores.data<double>(),
        out.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
