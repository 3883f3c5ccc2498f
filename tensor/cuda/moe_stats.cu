// The MoE statistics and dispatch on the GPU: the routing-warmup statistics and noise, the router's
// auxiliary-loss sums, the routing entropy, the dispatch's counting sort and the f64 running totals,
// with the CPU kernels' contracts (tensor/cpu/moe_stats.cc). (The grouped GEMMs over the dispatch's
// segments are cuBLAS calls, in gemm.cu.)
//
// Sums over a routing are reduce_terms (tensor/cuda/reduce_terms.h): f64, a fixed order, no atomics.
// The CPU adds the same f64 terms in element order on one thread, so the two agree to f64 rounding.
//
// The dispatch is a stable counting sort without atomics, in chunks of kDispatchChunk assignments:
//   1. a thread per chunk counts its chunk's assignments per expert (one row of chunk_counts [chunks, E]);
//   2. a thread per expert turns its column into the counts of the chunks before each chunk, and its
//      total; one thread turns the totals into the offsets;
//   3. a thread per chunk walks its assignments in order, placing each at its expert's offset plus the
//      earlier chunks' count plus its rank within the chunk.
// Every assignment lands where the CPU's sequential sort puts it: the same token_of, position_of and
// offsets, bit for bit. The counts per expert come from steps 1-2 for the auxiliary loss too.
#include <cmath>
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/reduce_terms.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

constexpr int64_t kDispatchChunk = 256;

// ---- routing-warmup statistics -----------------------------------------------------------------

template <class T>
struct LogitOf {
  const T* s;
  __device__ double operator()(int64_t i) const { return static_cast<double>(s[i]); }
};
// (s - mean)^2 with the mean's sum read on the device.
template <class T>
struct SquaredDeviation {
  const T* s;
  const double* sum;
  int64_t n;
  __device__ double operator()(int64_t i) const {
    const double mean = sum[0] / static_cast<double>(n);
    return (s[i] - mean) * (s[i] - mean);
  }
};

__global__ void warmup_update_kernel(const double* sums, int64_t n, double momentum, double* stats) {
  const double mean = sums[0] / static_cast<double>(n);
  const double std = sqrt(sums[1] / static_cast<double>(n));
  if (stats[2] == 0) {
    stats[0] = mean;
    stats[1] = std;
    stats[2] = 1;
  } else {
    stats[0] = momentum * stats[0] + (1 - momentum) * mean;
    stats[1] = momentum * stats[1] + (1 - momentum) * std;
  }
}

template <class T>
__global__ void warmup_noise_kernel(const double* stats, const double* eps, double alpha, int64_t n, T* noise) {
  const double mean = stats[0], std = stats[1];
  for (int64_t i = first_index(); i < n; i += grid_stride()) noise[i] = static_cast<T>((1 - alpha) * (mean + std * eps[i]));
}

// ---- expert counts and the dispatch --------------------------------------------------------------

__global__ void count_chunks_kernel(const int32_t* ids, int64_t M, int64_t E, int64_t* chunk_counts) {
  const int64_t chunks = (M + kDispatchChunk - 1) / kDispatchChunk;
  for (int64_t c = first_index(); c < chunks; c += grid_stride()) {
    int64_t* row = chunk_counts + c * E;
    for (int64_t e = 0; e < E; ++e) row[e] = 0;
    const int64_t end = (c + 1) * kDispatchChunk < M ? (c + 1) * kDispatchChunk : M;
    for (int64_t a = c * kDispatchChunk; a < end; ++a) ++row[ids[a]];
  }
}

// Column e of chunk_counts becomes the count of the chunks before each chunk; totals[e] the whole.
__global__ void prefix_chunks_kernel(int64_t chunks, int64_t E, int64_t* chunk_counts, int64_t* totals) {
  for (int64_t e = first_index(); e < E; e += grid_stride()) {
    int64_t before = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t count = chunk_counts[c * E + e];
      chunk_counts[c * E + e] = before;
      before += count;
    }
    totals[e] = before;
  }
}

// offsets [E + 1] = the exclusive scan of totals, closed by the number of assignments.
__global__ void offsets_kernel(const int64_t* totals, int64_t E, int64_t* offsets) {
  offsets[0] = 0;
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + totals[e];
}

__global__ void place_chunks_kernel(const int32_t* ids, int64_t M, int64_t E, int64_t k, const int64_t* offsets,
                                    int64_t* chunk_counts, int32_t* token_of, int32_t* position_of) {
  const int64_t chunks = (M + kDispatchChunk - 1) / kDispatchChunk;
  for (int64_t c = first_index(); c < chunks; c += grid_stride()) {
    int64_t* cursor = chunk_counts + c * E;  // the earlier chunks' count, advanced by this chunk's rows
    const int64_t end = (c + 1) * kDispatchChunk < M ? (c + 1) * kDispatchChunk : M;
    for (int64_t a = c * kDispatchChunk; a < end; ++a) {
      const int64_t position = offsets[ids[a]] + cursor[ids[a]]++;
      position_of[a] = static_cast<int32_t>(position);
      token_of[position] = static_cast<int32_t>(a / k);
    }
  }
}

// Steps 1-2 of the dispatch: chunk_counts [chunks, E] holds the earlier chunks' counts, totals [E] the
// assignments per expert.
void count_experts(const Tensor& ids, int64_t E, Tensor& chunk_counts, Tensor& totals) {
  const int64_t M = ids.numel(), chunks = (M + kDispatchChunk - 1) / kDispatchChunk;
  chunk_counts = Tensor::empty({chunks, E}, DType::I64, ids.device());
  totals = Tensor::empty({E}, DType::I64, ids.device());
  if (chunks > 0)
    LT_CUDA_LAUNCH(blocks_for(chunks), kThreadsPerBlock, count_chunks_kernel)(ids.data<int32_t>(), M, E,
                                                                              chunk_counts.data<int64_t>());
  if (E > 0)
    LT_CUDA_LAUNCH(blocks_for(E), kThreadsPerBlock, prefix_chunks_kernel)(chunks, E, chunk_counts.data<int64_t>(),
                                                                          totals.data<int64_t>());
  LT_CUDA_CHECK(cudaGetLastError());
}

// ---- the router's auxiliary losses and the routing entropy ----------------------------------------

template <class T>
__global__ void counts_to_dtype_kernel(const int64_t* totals, int64_t E, T* counts) {
  for (int64_t e = first_index(); e < E; e += grid_stride()) counts[e] = static_cast<T>(totals[e]);
}

template <class T>
struct BalanceTerm {  // probs[n, e] counts[e]
  const T* probs;
  const T* counts;
  int64_t E;
  __device__ double operator()(int64_t i) const {
    return static_cast<double>(probs[i]) * static_cast<double>(counts[i % E]);
  }
};
template <class T>
struct SquareOfLse {
  const T* lse;
  __device__ double operator()(int64_t n) const { return static_cast<double>(lse[n]) * lse[n]; }
};

template <class T>
__global__ void aux_loss_kernel(const double* sums, int64_t N, int64_t E, int64_t k, double balance_coef,
                                double z_coef, double* balance, double* z, T* aux) {
  const double balance_factor = N > 0 ? static_cast<double>(E) / (static_cast<double>(N) * N * k) : 0.0;
  const double z_factor = N > 0 ? 1.0 / static_cast<double>(N) : 0.0;
  const double b = sums[0] * balance_factor, zl = sums[1] * z_factor;
  balance[0] = b;
  z[0] = zl;
  aux[0] = static_cast<T>(balance_coef * b + z_coef * zl);
}

template <class T>
struct RowEntropy {  // lse[n] - sum_e p[n, e] s[n, e], the row's dot in e order as on the CPU
  const T* probs;
  const T* logits;
  const T* lse;
  int64_t E;
  __device__ double operator()(int64_t n) const {
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(probs[n * E + e]) * logits[n * E + e];
    return static_cast<double>(lse[n]) - dot;
  }
};

__global__ void mean_kernel(double* total, int64_t n) { total[0] = n > 0 ? total[0] / static_cast<double>(n) : 0; }

template <class T>
__global__ void accumulate_f64_kernel(const T* x, int64_t n, double* sum) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) sum[i] += static_cast<double>(x[i]);
}

}  // namespace

void routing_warmup_observe(const Tensor& logits, double momentum, Tensor& stats) {
  const int64_t n = logits.numel();
  const DeviceGuard guard(logits.device().index);
  Tensor sums = Tensor::empty({2}, DType::F64, logits.device());  // sum, then sum of squared deviations
  LT_FLOAT_SWITCH(logits.dtype(), T, {
    sum_terms(n, LogitOf<T>{logits.data<T>()}, sums.data<double>(), logits.device());
    sum_terms(n, SquaredDeviation<T>{logits.data<T>(), sums.data<double>(), n}, sums.data<double>() + 1,
              logits.device());
  });
  LT_CUDA_LAUNCH(1, 1, warmup_update_kernel)(sums.data<double>(), n, momentum, stats.data<double>());
  LT_CUDA_CHECK(cudaGetLastError());
}

void routing_warmup_noise(const Tensor& stats, const Tensor& eps, double alpha, Tensor& noise) {
  const int64_t n = noise.numel();
  if (n == 0) return;
  const DeviceGuard guard(noise.device().index);
  LT_FLOAT_SWITCH(noise.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, warmup_noise_kernel<T>)(stats.data<double>(), eps.data<double>(),
                                                                            alpha, n, noise.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void router_aux_loss(const Tensor& probs, const Tensor& lse, const Tensor& ids, double balance_coef, double z_coef,
                     Tensor& counts, Tensor& balance, Tensor& z, Tensor& aux) {
  const int64_t N = probs.dim(0), E = probs.dim(1), k = ids.dim(1);
  const DeviceGuard guard(probs.device().index);
  Tensor chunk_counts, totals;
  count_experts(ids, E, chunk_counts, totals);
  Tensor sums = Tensor::empty({2}, DType::F64, probs.device());  // balance sum, z sum
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    if (E > 0)
      LT_CUDA_LAUNCH(blocks_for(E), kThreadsPerBlock, counts_to_dtype_kernel<T>)(totals.data<int64_t>(), E,
                                                                                 counts.data<T>());
    sum_terms(N * E, BalanceTerm<T>{probs.data<T>(), counts.data<T>(), E}, sums.data<double>(), probs.device());
    sum_terms(N, SquareOfLse<T>{lse.data<T>()}, sums.data<double>() + 1, probs.device());
    LT_CUDA_LAUNCH(1, 1, aux_loss_kernel<T>)(sums.data<double>(), N, E, k, balance_coef, z_coef,
                                             balance.data<double>(), z.data<double>(), aux.data<T>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit) {
  const int64_t N = probs.dim(0), E = probs.dim(1);
  const DeviceGuard guard(probs.device().index);
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    sum_terms(N, RowEntropy<T>{probs.data<T>(), logits.data<T>(), lse.data<T>(), E}, entropy.data<double>(),
              probs.device());
    // The CPU's 0 for an empty routing is the identity of this reduction.
    reduce_terms(N * E, LogitOf<T>{logits.data<T>()}, MaxOp{}, N * E > 0 ? -INFINITY : 0.0,
                 max_logit.data<double>(), probs.device());
  });
  LT_CUDA_LAUNCH(1, 1, mean_kernel)(entropy.data<double>(), N);
  LT_CUDA_CHECK(cudaGetLastError());
}

void dispatch_plan(const Tensor& ids, Tensor& token_of, Tensor& position_of, Tensor& offsets) {
  const int64_t k = ids.dim(1), M = ids.numel(), E = offsets.numel() - 1;
  const DeviceGuard guard(ids.device().index);
  Tensor chunk_counts, totals;
  count_experts(ids, E, chunk_counts, totals);
  LT_CUDA_LAUNCH(1, 1, offsets_kernel)(totals.data<int64_t>(), E, offsets.data<int64_t>());
  const int64_t chunks = chunk_counts.dim(0);
  if (chunks > 0)
    LT_CUDA_LAUNCH(blocks_for(chunks), kThreadsPerBlock, place_chunks_kernel)(
        ids.data<int32_t>(), M, E, k, offsets.data<int64_t>(), chunk_counts.data<int64_t>(),
        token_of.data<int32_t>(), position_of.data<int32_t>());
  LT_CUDA_CHECK(cudaGetLastError());
}

void accumulate_f64(const Tensor& x, Tensor& sum) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const DeviceGuard guard(x.device().index);
  LT_FLOAT_SWITCH(x.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, accumulate_f64_kernel<T>)(x.data<T>(), n, sum.data<double>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
