// The MoE statistics and dispatch on the GPU: the routing-warmup statistics and noise, the router's
// auxiliary-loss sums, the routing entropy, the dispatch's counting sort and the f64 running totals,
// with the CPU kernels' contracts (tensor/cpu/moe_stats.cc). (The grouped GEMMs over the dispatch's
// segments are cuBLAS calls, in gemm.cu.) The work that needs everything before it (a total, then what
// depends on it) is finished by the last block of its launch (tensor/cuda/last_block.h): the routing
// entropy and the dispatch are one launch each; the auxiliary losses, the warmup statistics and the
// router after its projection (the choice of experts with the auxiliary losses) two.
//
// Sums over a routing are reductions in reduce_terms' order (tensor/cuda/reduce_terms.h): f64, a fixed
// order, no floating-point atomics. The CPU adds the same f64 terms in element order on one thread, so
// the two agree to f64 rounding.
//
// The dispatch is a stable counting sort without atomics, in chunks of kDispatchChunk assignments:
//   1. a thread per chunk counts its chunk's assignments per expert (one row of chunk_counts [chunks, E]);
//   2. the last block to finish turns each expert's column into the counts of the chunks before each
//      chunk, and its total; one of its threads turns the totals into the offsets;
//   3. that block's threads walk the chunks' assignments in order, a thread per chunk, placing each at
//      its expert's offset plus the earlier chunks' count plus its rank within the chunk.
// Every assignment lands where the CPU's sequential sort puts it: the same token_of, position_of and
// offsets, bit for bit. The router's counts per expert come from steps 1-2 too.
#include <algorithm>
#include <cmath>
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/last_block.h"
#include "tensor/cuda/reduce_terms.h"
#include "tensor/dtype_switch.h"
#include "tensor/moe_rows.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

constexpr int64_t kDispatchChunk = 256;

// ---- routing-warmup statistics -----------------------------------------------------------------

template <class T>
struct LogitOf {
  const T* s;
  __device__ double operator()(int64_t i) const { return static_cast<double>(s[i]); }
};
// d = s - shift and d^2, the shift (the statistics' mean) read on the device.
template <class T>
struct ShiftedLogit {
  const T* s;
  const double* shift;
  __device__ double operator()(int64_t i) const { return static_cast<double>(s[i]) - shift[0]; }
};
template <class T>
struct ShiftedSquare {
  const T* s;
  const double* shift;
  __device__ double operator()(int64_t i) const {
    const double d = static_cast<double>(s[i]) - shift[0];
    return d * d;
  }
};

// Both sums over n logits in one launch (`blocks` blocks, partial_B holding both reductions' partials),
// whose last block adds them and n to the observations.
template <class T>
__global__ void warmup_observe_kernel(ShiftedLogit<T> d, ShiftedSquare<T> d2, int64_t n, int64_t blocks,
                                      double* partial_B, double* observations) {
  write_block_partial(n, blocks, d, SumOp{}, 0.0, partial_B);
  write_block_partial(n, blocks, d2, SumOp{}, 0.0, partial_B + blocks);
  if (!last_block_to_finish()) return;
  const double sum = total_of_partials(partial_B, blocks, SumOp{}, 0.0);
  const double sum_sq = total_of_partials(partial_B + blocks, blocks, SumOp{}, 0.0);
  if (threadIdx.x != 0) return;
  observations[0] += static_cast<double>(n);
  observations[1] += sum;
  observations[2] += sum_sq;
}

__global__ void warmup_fold_kernel(double* observations, double momentum, double* stats) {
  if (blockIdx.x == 0 && threadIdx.x == 0) fold_warmup_observations(observations, momentum, stats);
}

template <class T>
__global__ void warmup_noise_kernel(const double* stats, const double* eps, double alpha, int64_t n, T* noise) {
  const double mean = stats[0], std = stats[1];
  for (int64_t i = first_index(); i < n; i += grid_stride()) noise[i] = static_cast<T>((1 - alpha) * (mean + std * eps[i]));
}

// ---- expert counts and the dispatch --------------------------------------------------------------

// The threads of a counting block. Its last block places every chunk, a thread per chunk: in one round
// up to kCountThreads chunks (262,144 assignments), as parallel as a thread per chunk over many blocks.
constexpr int kCountThreads = 1024;

// Steps 1-2 of the dispatch (kCountThreads threads a block): chunk_counts [chunks, E] ends holding the
// earlier chunks' counts and totals [E] the assignments per expert; then every thread of the last block
// calls finish().
template <class Finish>
__global__ void __launch_bounds__(kCountThreads)
    count_experts_kernel(const int32_t* ids, int64_t M, int64_t E, int64_t* chunk_counts, int64_t* totals,
                         Finish finish) {
  const int64_t chunks = (M + kDispatchChunk - 1) / kDispatchChunk;
  for (int64_t c = first_index(); c < chunks; c += grid_stride()) {
    int64_t* row = chunk_counts + c * E;
    for (int64_t e = 0; e < E; ++e) row[e] = 0;
    const int64_t end = (c + 1) * kDispatchChunk < M ? (c + 1) * kDispatchChunk : M;
    for (int64_t a = c * kDispatchChunk; a < end; ++a) ++row[ids[a]];
  }
  if (!last_block_to_finish()) return;
  volatile int64_t* counts = written_by_other_blocks(chunk_counts);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t before = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t count = counts[c * E + e];
      counts[c * E + e] = before;
      before += count;
    }
    totals[e] = before;
  }
  __syncthreads();
  finish();
}

// Counts the assignments of ids [N, k] per expert of E in one launch, then runs finish on its last
// block; chunk_counts [chunks, E] and totals [E] (i64, the scratch that finish reads) come from
// make_finish(chunk_counts, totals).
template <class MakeFinish>
void count_experts(const Tensor& ids, int64_t E, MakeFinish make_finish) {
  const int64_t M = ids.numel(), chunks = (M + kDispatchChunk - 1) / kDispatchChunk;
  Tensor chunk_counts = Tensor::empty({chunks, E}, DType::I64, ids.device());
  Tensor totals = Tensor::empty({E}, DType::I64, ids.device());
  auto finish = make_finish(chunk_counts.data<int64_t>(), totals.data<int64_t>());
  const int blocks = static_cast<int>(std::clamp<int64_t>((chunks + kCountThreads - 1) / kCountThreads, 1, kMaxBlocks));
  LT_CUDA_LAUNCH(blocks, kCountThreads, count_experts_kernel<decltype(finish)>)(
      ids.data<int32_t>(), M, E, chunk_counts.data<int64_t>(), totals.data<int64_t>(), finish);
  LT_CUDA_CHECK(cudaGetLastError());
}

// Step 3 on the last counting block: offsets [E + 1] = the exclusive scan of totals, closed by the
// number of assignments; then each chunk's assignments placed in order.
struct PlaceChunks {
  const int32_t* ids;
  int64_t M, E, k;
  int64_t* chunk_counts;  // the earlier chunks' counts, advanced by each chunk's rows
  const int64_t* totals;
  int64_t* offsets;
  int32_t* token_of;
  int32_t* position_of;
  __device__ void operator()() const {
    if (threadIdx.x == 0) {
      offsets[0] = 0;
      for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + totals[e];
    }
    __syncthreads();
    const int64_t chunks = (M + kDispatchChunk - 1) / kDispatchChunk;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      int64_t* cursor = chunk_counts + c * E;
      const int64_t end = (c + 1) * kDispatchChunk < M ? (c + 1) * kDispatchChunk : M;
      for (int64_t a = c * kDispatchChunk; a < end; ++a) {
        const int64_t position = offsets[ids[a]] + cursor[ids[a]]++;
        position_of[a] = static_cast<int32_t>(position);
        token_of[position] = static_cast<int32_t>(a / k);
      }
    }
  }
};

// ---- the router's auxiliary losses and the routing entropy ----------------------------------------

// The router's counts per expert in its dtype, on the last counting block.
template <class T>
struct CountsInDtype {
  const int64_t* totals;
  int64_t E;
  T* counts;
  __device__ void operator()() const {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) counts[e] = static_cast<T>(totals[e]);
  }
};

// router_topk's rows, a thread per token (tensor/moe_rows.h, as in moe.cu), with the chosen experts
// counted per block into its row of block_counts [blocks, E]: a thread per expert over the ids of each
// tile of rows the block chose. The last block adds the rows up into counts.
template <class T>
__global__ void router_topk_counts_kernel(const T* logits, int64_t N, int64_t E, int64_t k, bool renormalize,
                                          T* probs, T* lse, T* weights, int32_t* ids, int64_t* block_counts,
                                          T* counts) {
  int64_t* block_row = block_counts + blockIdx.x * E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) block_row[e] = 0;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x; first < N; first += grid_stride()) {
    const int64_t n = first + threadIdx.x;
    if (n < N) RouterTopKRow(logits + n * E, E, k, renormalize, probs + n * E, lse + n, weights + n * k, ids + n * k);
    __syncthreads();  // the tile's ids are written
    const int64_t end = (first + blockDim.x < N ? first + blockDim.x : N) * k;
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      int64_t count = 0;
      for (int64_t a = first * k; a < end; ++a) count += ids[a] == e;
      block_row[e] += count;
    }
  }
  if (!last_block_to_finish()) return;
  const volatile int64_t* rows = written_by_other_blocks(block_counts);
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t total = 0;
    for (int64_t b = 0; b < gridDim.x; ++b) total += rows[b * E + e];
    counts[e] = static_cast<T>(total);
  }
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

// The balance sum over N E terms (balance_blocks blocks) and the z sum over N (z_blocks) in one launch
// of the larger grid, partial_B holding both reductions' partials; the last block writes the losses.
template <class T>
__global__ void aux_loss_kernel(BalanceTerm<T> balance_term, SquareOfLse<T> z_term, int64_t N, int64_t k,
                                int64_t balance_blocks, int64_t z_blocks, double balance_coef, double z_coef,
                                double* partial_B, double* balance, double* z, T* aux) {
  const int64_t E = balance_term.E;
  write_block_partial(N * E, balance_blocks, balance_term, SumOp{}, 0.0, partial_B);
  write_block_partial(N, z_blocks, z_term, SumOp{}, 0.0, partial_B + balance_blocks);
  if (!last_block_to_finish()) return;
  const double balance_sum = total_of_partials(partial_B, balance_blocks, SumOp{}, 0.0);
  const double z_sum = total_of_partials(partial_B + balance_blocks, z_blocks, SumOp{}, 0.0);
  if (threadIdx.x != 0) return;
  const double balance_factor = N > 0 ? static_cast<double>(E) / (static_cast<double>(N) * N * k) : 0.0;
  const double z_factor = N > 0 ? 1.0 / static_cast<double>(N) : 0.0;
  const double b = balance_sum * balance_factor, zl = z_sum * z_factor;
  balance[0] = b;
  z[0] = zl;
  aux[0] = static_cast<T>(balance_coef * b + z_coef * zl);
}

// The auxiliary losses of probs [N, E] and lse [N], with counts [E] of N k assignments on the device.
template <class T>
void launch_aux_loss(const Tensor& probs, const Tensor& lse, int64_t k, const Tensor& counts, double balance_coef,
                     double z_coef, Tensor& balance, Tensor& z, Tensor& aux) {
  const int64_t N = probs.dim(0), E = probs.dim(1);
  const int64_t balance_blocks = partial_blocks(N * E), z_blocks = partial_blocks(N);
  Tensor partial_B = Tensor::empty({balance_blocks + z_blocks}, DType::F64, probs.device());
  LT_CUDA_LAUNCH(static_cast<int>(std::max(balance_blocks, z_blocks)), kRowThreads, aux_loss_kernel<T>)(
      BalanceTerm<T>{probs.data<T>(), counts.data<T>(), E}, SquareOfLse<T>{lse.data<T>()}, N, k, balance_blocks,
      z_blocks, balance_coef, z_coef, partial_B.data<double>(), balance.data<double>(), z.data<double>(),
      aux.data<T>());
  LT_CUDA_CHECK(cudaGetLastError());
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

// The entropy sum over N rows (entropy_blocks blocks) and the largest of N E logits (max_blocks) in one
// launch of the larger grid, partial_B holding both reductions' partials; the last block writes the
// mean entropy and the largest logit. The CPU's 0 for an empty routing is the maximum's identity.
template <class T>
__global__ void routing_entropy_kernel(RowEntropy<T> entropy_term, int64_t N, int64_t entropy_blocks,
                                       int64_t max_blocks, double* partial_B, double* entropy, double* max_logit) {
  const int64_t NE = N * entropy_term.E;
  const double no_logit = NE > 0 ? -INFINITY : 0.0;
  write_block_partial(N, entropy_blocks, entropy_term, SumOp{}, 0.0, partial_B);
  write_block_partial(NE, max_blocks, LogitOf<T>{entropy_term.logits}, MaxOp{}, no_logit, partial_B + entropy_blocks);
  if (!last_block_to_finish()) return;
  const double total = total_of_partials(partial_B, entropy_blocks, SumOp{}, 0.0);
  const double largest = total_of_partials(partial_B + entropy_blocks, max_blocks, MaxOp{}, no_logit);
  if (threadIdx.x != 0) return;
  entropy[0] = N > 0 ? total / static_cast<double>(N) : 0;
  max_logit[0] = largest;
}

template <class T>
__global__ void accumulate_f64_kernel(const T* x, int64_t n, double* sum) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) sum[i] += static_cast<double>(x[i]);
}

}  // namespace

void routing_warmup_observe(const Tensor& logits, const Tensor& stats, Tensor& observations) {
  const int64_t n = logits.numel(), blocks = partial_blocks(n);
  const DeviceGuard guard(logits.device().index);
  Tensor partial_B = Tensor::empty({2 * blocks}, DType::F64, logits.device());
  LT_FLOAT_SWITCH(logits.dtype(), T, {
    LT_CUDA_LAUNCH(static_cast<int>(blocks), kRowThreads, warmup_observe_kernel<T>)(
        ShiftedLogit<T>{logits.data<T>(), stats.data<double>()}, ShiftedSquare<T>{logits.data<T>(), stats.data<double>()},
        n, blocks, partial_B.data<double>(), observations.data<double>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void routing_warmup_fold(Tensor& observations, double momentum, Tensor& stats) {
  const DeviceGuard guard(stats.device().index);
  LT_CUDA_LAUNCH(1, 1, warmup_fold_kernel)(observations.data<double>(), momentum, stats.data<double>());
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
  const int64_t E = probs.dim(1);
  const DeviceGuard guard(probs.device().index);
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    count_experts(ids, E,
                  [&](int64_t*, const int64_t* totals) { return CountsInDtype<T>{totals, E, counts.data<T>()}; });
    launch_aux_loss<T>(probs, lse, ids.dim(1), counts, balance_coef, z_coef, balance, z, aux);
  });
}

void router_topk_with_aux_loss(const Tensor& logits, int64_t k, bool renormalize, double balance_coef, double z_coef,
                               Tensor& probs, Tensor& lse, Tensor& weights, Tensor& ids, Tensor& counts,
                               Tensor& balance, Tensor& z, Tensor& aux) {
  const int64_t N = logits.dim(0), E = logits.dim(1);
  const int blocks = std::max(1, blocks_for(N));  // no rows: one block still writes the counts
  const DeviceGuard guard(logits.device().index);
  Tensor block_counts = Tensor::empty({blocks, E}, DType::I64, logits.device());
  LT_FLOAT_SWITCH(logits.dtype(), T, {
    LT_CUDA_LAUNCH(blocks, kThreadsPerBlock, router_topk_counts_kernel<T>)(
        logits.data<T>(), N, E, k, renormalize, probs.data<T>(), lse.data<T>(), weights.data<T>(),
        ids.data<int32_t>(), block_counts.data<int64_t>(), counts.data<T>());
    launch_aux_loss<T>(probs, lse, k, counts, balance_coef, z_coef, balance, z, aux);
  });
}

void routing_entropy(const Tensor& probs, const Tensor& logits, const Tensor& lse, Tensor& entropy,
                     Tensor& max_logit) {
  const int64_t N = probs.dim(0), E = probs.dim(1);
  const int64_t entropy_blocks = partial_blocks(N), max_blocks = partial_blocks(N * E);
  const DeviceGuard guard(probs.device().index);
  Tensor partial_B = Tensor::empty({entropy_blocks + max_blocks}, DType::F64, probs.device());
  LT_FLOAT_SWITCH(probs.dtype(), T, {
    LT_CUDA_LAUNCH(static_cast<int>(std::max(entropy_blocks, max_blocks)), kRowThreads, routing_entropy_kernel<T>)(
        RowEntropy<T>{probs.data<T>(), logits.data<T>(), lse.data<T>(), E}, N, entropy_blocks, max_blocks,
        partial_B.data<double>(), entropy.data<double>(), max_logit.data<double>());
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

void dispatch_plan(const Tensor& ids, Tensor& token_of, Tensor& position_of, Tensor& offsets) {
  const int64_t k = ids.dim(1), M = ids.numel(), E = offsets.numel() - 1;
  const DeviceGuard guard(ids.device().index);
  count_experts(ids, E, [&](int64_t* chunk_counts, const int64_t* totals) {
    return PlaceChunks{ids.data<int32_t>(), M,        E, k, chunk_counts, totals, offsets.data<int64_t>(),
                       token_of.data<int32_t>(), position_of.data<int32_t>()};
  });
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
