// The experts' grouped GEMM under mixed precision: bf16 operands, f32 sums, an f32 result, on the tensor
// cores (wmma 16x16x16 fragments), one launch per part of a grouped call (tensor/cuda/kernels.h's
// GroupedGemm). cuBLAS's grouped call takes bf16 operands only with a bf16 result, and rounding the
// experts' products to bf16 would part them from the CPU's (which keep f32 results); the fallback, a
// cuBLAS call per expert, made a bf16 step slower than an f32 one. This kernel keeps the contract of the
// CPU's bf16 GEMM: the same bf16 operands, f32 accumulation, c = sums + beta c.
//
// A block computes a 128 x 128 tile of one problem's result: eight warps as 2 x 4, each a 64 x 32 piece
// (4 x 2 fragments), stepping k by 32. Operand tiles go through shared memory in their stored
// orientation (a transposed operand is read as a column-major fragment), loaded 16 bytes a thread at a
// time (zeros past the problem's edges), the next tile's loads in flight in registers while the current
// one is multiplied. Problem j's sizes and addresses come from the call's table on the device (rows a, b,
// c, m, n, k: grouped_pointers_kernel), so a launch needs no copy; the blocks are the problems' tiles in
// order, each finding its problem by a walk over the sizes (a few hundred problems at most).
//
// Deterministic: every result element is one warp's fragment, summed in k order by the tensor cores.
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for these
#include <cuda_bf16.h>
#include <mma.h>

#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/kernels.h"
#include "tensor/error.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace grouped_tensor_cores {

namespace wmma = nvcuda::wmma;

constexpr int kSide = 16;  // of a wmma fragment
constexpr int kTileM = 128, kTileN = 128, kTileK = 32;
constexpr int kWarpsM = 2, kWarpsN = 4, kThreads = kWarpsM * kWarpsN * 32;
constexpr int kFragsM = kTileM / kWarpsM / kSide, kFragsN = kTileN / kWarpsN / kSide;  // per warp: 4 x 2
constexpr int kVector = 8;  // bf16 values in one 16-byte load
// Shared-memory rows padded by 16 bytes, so that a fragment's 16 rows fall on different banks; a tile
// in either orientation ([128][32 + 8] or [32][128 + 8]) fits the larger.
constexpr int kPad = 8;
constexpr int kTileElements = kTileM * (kTileK + kPad) > kTileK * (kTileM + kPad) ? kTileM * (kTileK + kPad)
                                                                                   : kTileK * (kTileM + kPad);
constexpr int kLoadsPerThread = kTileM * kTileK / kVector / kThreads;  // 16-byte loads of one operand tile
static_assert(kTileM == kTileN && kLoadsPerThread * kVector * kThreads == kTileM * kTileK);

using Accumulator = wmma::fragment<wmma::accumulator, kSide, kSide, kSide, float>;

// One part of a call: its problems are columns [first, first + count) of the table [6, stride].
struct Part {
  const int64_t* table;
  int64_t stride, first, count;
  int64_t ld_a, ld_b, ld_c;
  float beta;
};

struct Problem {
  const uint16_t *a, *b;
  float* c;
  int64_t m, n, k;
};

__device__ inline Problem problem_at(const Part& part, int64_t j) {
  const int64_t* column = part.table + part.first + j;
  auto at = [&](int row) { return column[row * part.stride]; };
  return {reinterpret_cast<const uint16_t*>(static_cast<intptr_t>(at(0))),
          reinterpret_cast<const uint16_t*>(static_cast<intptr_t>(at(1))),
          reinterpret_cast<float*>(static_cast<intptr_t>(at(2))), at(3), at(4), at(5)};
}

__host__ __device__ inline int64_t tiles_of(int64_t m, int64_t n) {
  return ((m + kTileM - 1) / kTileM) * ((n + kTileN - 1) / kTileN);
}

// 16 bytes, the unit of a tile's loads and stores.
struct alignas(16) Chunk {
  uint32_t words[4];
};

// One operand tile of kRows x kCols stored elements (rows of the stored matrix, whose row length is ld),
// from (row0, col0), rows below `rows` and columns below `cols` valid: a thread's share held in
// registers between the global load and the shared-memory store.
template <int kRows, int kCols>
struct TileLoad {
  static_assert(kRows * kCols == kTileM * kTileK);
  Chunk parts[kLoadsPerThread];

  __device__ void load(const uint16_t* x, int64_t ld, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
      const int64_t row = row0 + chunk / (kCols / kVector), col = col0 + chunk % (kCols / kVector) * kVector;
      uint16_t values[kVector] = {};
      if (row < rows && col + kVector <= cols) {
        parts[i] = *reinterpret_cast<const Chunk*>(x + row * ld + col);
        continue;
      }
      for (int e = 0; e < kVector; ++e)
        if (row < rows && col + e < cols) values[e] = x[row * ld + col + e];
      std::memcpy(&parts[i], values, sizeof values);
    }
  }

  __device__ void store(uint16_t* tile) const {
    for (int i = 0; i < kLoadsPerThread; ++i) {
      const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
      const int row = chunk / (kCols / kVector), col = chunk % (kCols / kVector) * kVector;
      *reinterpret_cast<Chunk*>(tile + row * (kCols + kPad) + col) = parts[i];
    }
  }
};

// bf16 tiles are held as bits and read by wmma as __nv_bfloat16: the same two bytes.
__device__ inline const __nv_bfloat16* as_bf16(const uint16_t* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

// c [m, n] (+)= op(a) [m, k] op(b) [k, n] for the problem that block blockIdx.x's tile belongs to. a is
// stored [m, k] (or [k, m] when kTransA), b [k, n] (or [n, k] when kTransB), every row 16-byte aligned.
template <bool kTransA, bool kTransB>
__global__ void __launch_bounds__(kThreads) grouped_gemm_bf16_kernel(Part part) {
  struct alignas(128) Shared {
    uint16_t a[kTileElements], b[kTileElements];
    float staging[kWarpsM * kWarpsN][kSide * kSide];  // a warp's fragment on its way to c
  };
  __shared__ Shared shared;

  int64_t tile = blockIdx.x, j = 0;
  Problem p = problem_at(part, 0);
  for (; tile >= tiles_of(p.m, p.n); p = problem_at(part, ++j)) tile -= tiles_of(p.m, p.n);
  const int64_t tiles_n = (p.n + kTileN - 1) / kTileN;
  const int64_t m0 = tile / tiles_n * kTileM, n0 = tile % tiles_n * kTileN;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int warp_m = warp / kWarpsN * (kTileM / kWarpsM), warp_n = warp % kWarpsN * (kTileN / kWarpsN);
  // The warp's fragments that hold any of the result (a ragged tile's others are never multiplied).
  auto clamp_frags = [](int64_t left, int most) {
    const int64_t frags = left <= 0 ? 0 : (left + kSide - 1) / kSide;
    return static_cast<int>(frags < most ? frags : most);
  };
  const int frags_m = clamp_frags(p.m - m0 - warp_m, kFragsM), frags_n = clamp_frags(p.n - n0 - warp_n, kFragsN);

  // The stored orientation of each operand tile: a [m][k] or [k][m], b [k][n] or [n][k].
  TileLoad<kTransA ? kTileK : kTileM, kTransA ? kTileM : kTileK> load_a;
  TileLoad<kTransB ? kTileN : kTileK, kTransB ? kTileK : kTileN> load_b;
  auto load = [&](int64_t k0) {
    if (kTransA) load_a.load(p.a, part.ld_a, k0, p.k, m0, p.m);
    else load_a.load(p.a, part.ld_a, m0, p.m, k0, p.k);
    if (kTransB) load_b.load(p.b, part.ld_b, n0, p.n, k0, p.k);
    else load_b.load(p.b, part.ld_b, k0, p.k, n0, p.n);
  };

  using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
  constexpr int kStrideA = (kTransA ? kTileM : kTileK) + kPad, kStrideB = (kTransB ? kTileK : kTileN) + kPad;
  Accumulator acc[kFragsM][kFragsN];
#pragma unroll
  for (auto& row : acc)
#pragma unroll
    for (Accumulator& f : row) wmma::fill_fragment(f, 0.0f);

  const int64_t k_tiles = (p.k + kTileK - 1) / kTileK;
  load(0);
  load_a.store(shared.a);
  load_b.store(shared.b);
  __syncthreads();
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    if (kt + 1 < k_tiles) load((kt + 1) * kTileK);
    for (int kk = 0; kk < kTileK; kk += kSide) {
      wmma::fragment<wmma::matrix_a, kSide, kSide, kSide, __nv_bfloat16, LayoutA> a[kFragsM];
      wmma::fragment<wmma::matrix_b, kSide, kSide, kSide, __nv_bfloat16, LayoutB> b[kFragsN];
#pragma unroll
      for (int fm = 0; fm < kFragsM; ++fm) {
        const int row = warp_m + fm * kSide;
        if (fm < frags_m)
          wmma::load_matrix_sync(a[fm], as_bf16(shared.a + (kTransA ? kk * kStrideA + row : row * kStrideA + kk)),
                                 kStrideA);
      }
#pragma unroll
      for (int fn = 0; fn < kFragsN; ++fn) {
        const int col = warp_n + fn * kSide;
        if (fn < frags_n)
          wmma::load_matrix_sync(b[fn], as_bf16(shared.b + (kTransB ? col * kStrideB + kk : kk * kStrideB + col)),
                                 kStrideB);
      }
#pragma unroll
      for (int fm = 0; fm < kFragsM; ++fm)
#pragma unroll
        for (int fn = 0; fn < kFragsN; ++fn)
          if (fm < frags_m && fn < frags_n) wmma::mma_sync(acc[fm][fn], a[fm], b[fn], acc[fm][fn]);
    }
    __syncthreads();
    if (kt + 1 < k_tiles) {
      load_a.store(shared.a);
      load_b.store(shared.b);
      __syncthreads();
    }
  }

  // Each fragment through the warp's staging to c: c = sums + beta c (c not read where beta is 0).
  float* staging = shared.staging[warp];
#pragma unroll
  for (int fm = 0; fm < kFragsM; ++fm)
#pragma unroll
    for (int fn = 0; fn < kFragsN; ++fn) {
      if (fm >= frags_m || fn >= frags_n) continue;  // the fragments' indices stay constants: registers
      wmma::store_matrix_sync(staging, acc[fm][fn], kSide, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < kSide * kSide; e += 32) {
        const int64_t row = m0 + warp_m + fm * kSide + e / kSide, col = n0 + warp_n + fn * kSide + e % kSide;
        if (row >= p.m || col >= p.n) continue;
        float* out = p.c + row * part.ld_c + col;
        *out = part.beta == 0.0f ? staging[e] : staging[e] + part.beta * *out;
      }
      __syncwarp();
    }
}

template <bool kTransA, bool kTransB>
void launch(const Part& part, int64_t tiles, uint64_t flops) {
  LT_CUDA_GEMM_LAUNCH(flops, static_cast<unsigned>(tiles), kThreads, grouped_gemm_bf16_kernel<kTransA, kTransB>)(part);
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace grouped_tensor_cores

bool grouped_gemm_bf16_takes(const GroupedGemm& g) {
  for (const GroupedGemm::Part& part : g.parts)
    if (part.a.dtype() != DType::BF16 || part.b.dtype() != DType::BF16) return false;
  return g.aligned16;  // every row 16-byte aligned: the kernel's 16-byte loads
}

void grouped_gemm_bf16(const GroupedGemm& g) {
  using namespace grouped_tensor_cores;
  LT_CHECK(grouped_gemm_bf16_takes(g), "cuda grouped bf16 GEMM: operands not bf16 rows of 16-byte multiples");
  const int64_t per_part = g.problems_per_part();
  for (size_t p = 0; p < g.parts.size(); ++p) {
    const GroupedGemm::Part& gp = g.parts[p];
    const Part part{g.pointers.data<int64_t>(), g.pointers.dim(1), static_cast<int64_t>(p) * per_part, per_part,
                    gp.a.dim(-1), gp.b.dim(-1), gp.c.dim(-1), static_cast<float>(gp.beta)};
    int64_t tiles = 0;
    for (int64_t j = part.first; j < part.first + per_part; ++j)
      tiles += tiles_of(g.m[static_cast<size_t>(j)], g.n[static_cast<size_t>(j)]);
    const uint64_t flops = g.part_flops(p);
    if (tiles == 0) continue;
    LT_CHECK(tiles < (int64_t{1} << 31), "cuda grouped bf16 GEMM: ", tiles, " tiles, more than a grid holds");
    if (gp.trans_a && gp.trans_b) launch<true, true>(part, tiles, flops);
    else if (gp.trans_a) launch<true, false>(part, tiles, flops);
    else if (gp.trans_b) launch<false, true>(part, tiles, flops);
    else launch<false, false>(part, tiles, flops);
  }
}

}  // namespace lt::LT_CUDA_NAMESPACE
