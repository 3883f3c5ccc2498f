// Running the hand-written CUDA kernels on the CPU, for the tests of machines without a GPU.
//
// A test translation unit defines LINGTRAIN_CUDA_EMULATION, includes this header and then a .cu file:
// the file compiles as plain C++, its kernels and their Tensor-level launchers land in namespace
// lt::cuda_emulated (LT_CUDA_NAMESPACE), and they run on CPU tensors, so each kernel's arithmetic and
// indexing (grid-stride loops, partial tiles, odd sizes) is compared with the CPU kernel in CTest. What
// this cannot show: speed, the memory model of real hardware, and cuBLAS (not emulated).
//
// The model of execution, as CUDA defines it for correct programs:
//   - blocks run one after another; a block's threads are fibers (ucontext) on the calling thread, each
//     running until it waits at a barrier or ends, in turns whose order alternates (first to last, then
//     last to first): a missing __syncthreads lets some thread read before another has written (or
//     write before another has read) in one order or the other, every run alike;
//   - a kernel that throws (an LT_CHECK inside device code) ends the test: nothing is caught;
//   - __shared__ variables are static locals: one instance, shared by the threads of the running block;
//   - __syncthreads() is a barrier across the block's threads; one that some of them never reach (a
//     hang on a GPU) ends the launch with an error;
//   - warp shuffles exchange values among the 32 threads of a warp, all of which must take part (as
//     the *_sync intrinsics require with a full mask); __syncwarp is a barrier among them;
//   - the warp matrix functions (nvcuda::wmma, bf16 operands and f32 accumulators at 16x16x16) give
//     every lane the whole tile: valid for code that reads fragments only through them (below);
//   - atomicInc on an unsigned counter is a plain read-modify-write (one fiber runs at a time), and
//     __threadfence orders nothing (one thread's writes are the memory every fiber reads): the last
//     block to finish a launch (tensor/cuda/last_block.h) is the grid's last.
#pragma once
#ifndef LINGTRAIN_CUDA_EMULATION
#error "tensor/cuda/emulation.h is for the CPU emulation of the CUDA kernels (define LINGTRAIN_CUDA_EMULATION)"
#endif

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "tensor/device_counters.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

// The kernels' namespace: lt::cuda_emulated beside the real backend (the kernel tests), or lt::cuda itself
// where a test build stands the emulated kernels in for the GPU (tests/cuda/emulated_gpu.cpp, which
// defines LINGTRAIN_EMULATED_GPU and supplies lt::cuda's runtime functions and DeviceGuard).
#ifdef LINGTRAIN_EMULATED_GPU
#define LT_CUDA_NAMESPACE cuda
#else
#define LT_CUDA_NAMESPACE cuda_emulated
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

// kernel<<<grid, block>>>(args...) as a call the emulator runs, counted as a launch is on a GPU.
#define LT_CUDA_LAUNCH(grid, block, ...)                                                         \
  [&](auto&&... lt_launch_args) {                                                                \
    ::lt::device_count::launch();                                                                \
    ::lt::cuda_emulation::run_grid((grid), (block), [&] { __VA_ARGS__(lt_launch_args...); });    \
  }
#define LT_CUDA_GEMM_LAUNCH(flops, grid, block, ...)                                             \
  [&](auto&&... lt_launch_args) {                                                                \
    ::lt::device_count::blas_call(flops);                                                        \
    ::lt::cuda_emulation::run_grid((grid), (block), [&] { __VA_ARGS__(lt_launch_args...); });    \
  }

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// The built-in variables: per emulated thread.
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

using cudaError_t = int;
inline constexpr cudaError_t cudaSuccess = 0;
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
#define LT_CUDA_CHECK(call) LT_CHECK((call) == cudaSuccess, "emulated CUDA call failed: ", #call)
#define LT_CUDA_ZERO_ASYNC(data, bytes) (::lt::device_count::launch(), std::memset((data), 0, (bytes)))

namespace lt::cuda_emulation {

inline constexpr unsigned kWarpSize = 32;
// Each emulated thread's stack. The kernels keep a few small per-thread arrays (attention's accumulator
// row); the memory is only touched where used.
inline constexpr size_t kFiberStackBytes = 256 * 1024;

// The fibers' stacks, kept from launch to launch: mapping and faulting in fresh ones for every launch
// cost more than the kernels' work.
inline char* fiber_stacks(unsigned threads) {
  thread_local std::unique_ptr<char[]> stacks;
  thread_local unsigned capacity = 0;
  if (threads > capacity) {
    stacks.reset(new char[threads * kFiberStackBytes]);
    capacity = threads;
  }
  return stacks.get();
}

// A barrier among the fibers of a block: every arrival but the last yields until the last one opens it.
struct FiberBarrier {
  unsigned count = 0, arrived = 0, generation = 0;
};

// The running block: its threads' fibers, the scheduler's context they return to, and what they share
// (the block barrier and each warp's exchange slots). Fibers replace OS threads because a block of 256
// threads meeting at each barrier cost the OS a context switch per thread: the emulated training
// steps spent most of their time in the kernel.
struct Block {
  explicit Block(unsigned threads)
      : fibers(threads), finished(threads, false), stacks(fiber_stacks(threads)), warp_values(threads) {
    barrier.count = threads;
    for (unsigned w = 0; w < (threads + kWarpSize - 1) / kWarpSize; ++w)
      warp_barriers.push_back(FiberBarrier{std::min(kWarpSize, threads - w * kWarpSize)});
  }
  std::vector<ucontext_t> fibers;
  std::vector<bool> finished;
  char* stacks;
  ucontext_t scheduler;
  unsigned running = 0;
  uint64_t arrivals = 0;  // barrier arrivals so far: a round of turns without one is a deadlock
  FiberBarrier barrier;
  std::vector<FiberBarrier> warp_barriers;
  std::vector<double> warp_values;  // one slot per thread; shuffled values travel as double (exact for f32, f64, i32)
};
inline thread_local Block* current_block = nullptr;
inline thread_local const std::function<void()>* current_body = nullptr;

inline void wait_at(FiberBarrier& barrier) {
  Block& b = *current_block;
  ++b.arrivals;
  const unsigned generation = barrier.generation;
  if (++barrier.arrived == barrier.count) {
    barrier.arrived = 0;
    ++barrier.generation;
    return;
  }
  while (barrier.generation == generation) swapcontext(&b.fibers[b.running], &b.scheduler);
}

// One emulated thread: every block of the grid in turn, with a barrier at each block's end that keeps
// the next block's writes to __shared__ memory from meeting the last reads of the previous one. So all
// fibers are in the same block whenever one waits, and blockIdx needs no saving across switches.
inline void fiber_main() {
  Block& b = *current_block;
  for (unsigned bz = 0; bz < gridDim.z; ++bz)
    for (unsigned by = 0; by < gridDim.y; ++by)
      for (unsigned bx = 0; bx < gridDim.x; ++bx) {
        blockIdx = dim3(bx, by, bz);
        (*current_body)();
        wait_at(b.barrier);
      }
  b.finished[b.running] = true;
}  // returns to the scheduler (uc_link)

// Runs `body` (one kernel launch with its arguments bound) for every thread of every block.
inline void run_grid(dim3 grid, dim3 block, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  LT_CHECK(threads >= 1 && threads <= 1024, "emulated launch: ", threads, " threads per block (1 to 1024)");
  LT_CHECK(current_block == nullptr, "emulated launch from inside an emulated kernel");
  Block shared(threads);
  current_block = &shared;
  current_body = &body;
  struct Unset {  // also when a deadlock throws
    ~Unset() {
      current_block = nullptr;
      current_body = nullptr;
    }
  } unset_on_exit;
  blockDim = block;
  gridDim = grid;
  for (unsigned t = 0; t < threads; ++t) {
    ucontext_t& fiber = shared.fibers[t];
    getcontext(&fiber);
    fiber.uc_stack.ss_sp = shared.stacks + t * kFiberStackBytes;
    fiber.uc_stack.ss_size = kFiberStackBytes;
    fiber.uc_link = &shared.scheduler;
    makecontext(&fiber, fiber_main, 0);
  }
  for (unsigned left = threads, round = 0; left > 0; ++round) {
    const uint64_t arrivals_before = shared.arrivals;
    const unsigned left_before = left;
    for (unsigned i = 0; i < threads; ++i) {
      const unsigned t = round % 2 == 0 ? i : threads - 1 - i;
      if (shared.finished[t]) continue;
      shared.running = t;
      threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
      swapcontext(&shared.scheduler, &shared.fibers[t]);
      if (shared.finished[t]) --left;
    }
    LT_CHECK(left == 0 || shared.arrivals != arrivals_before || left != left_before,
             "emulated launch deadlocked: threads wait at a barrier the others never reach");
  }
}

inline unsigned linear_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// Every thread of the warp publishes its value, then reads its partner's; the second barrier keeps a
// fast thread from overwriting its slot before the slow ones have read.
template <class T>
T shuffle(T value, unsigned partner_lane) {
  Block& b = *current_block;
  const unsigned me = linear_thread(), warp = me / kWarpSize;
  FiberBarrier& sync = b.warp_barriers[warp];
  b.warp_values[me] = static_cast<double>(value);
  wait_at(sync);
  const unsigned partner = warp * kWarpSize + partner_lane;
  const T result =
      partner < b.warp_values.size() && partner_lane < kWarpSize ? static_cast<T>(b.warp_values[partner]) : value;
  wait_at(sync);
  return result;
}

}  // namespace lt::cuda_emulation

inline void __syncthreads() { lt::cuda_emulation::wait_at(lt::cuda_emulation::current_block->barrier); }

inline void __threadfence() {}
// CUDA's atomicInc: the old value, and *address wraps to 0 once it has reached `wrap`.
inline unsigned atomicInc(unsigned* address, unsigned wrap) {
  const unsigned old = *address;
  *address = old >= wrap ? 0 : old + 1;
  return old;
}

// The lane `delta` above reads; lanes past the warp's end keep their own value, as on the hardware.
template <class T>
T __shfl_down_sync(unsigned /*mask*/, T value, unsigned delta) {
  const unsigned lane = lt::cuda_emulation::linear_thread() % lt::cuda_emulation::kWarpSize;
  return lt::cuda_emulation::shuffle(value, lane + delta < lt::cuda_emulation::kWarpSize ? lane + delta : lane);
}
template <class T>
T __shfl_xor_sync(unsigned /*mask*/, T value, unsigned lane_mask) {
  const unsigned lane = lt::cuda_emulation::linear_thread() % lt::cuda_emulation::kWarpSize;
  return lt::cuda_emulation::shuffle(value, lane ^ lane_mask);
}

// The barrier among the threads of one warp (all 32 take part, as with a full mask).
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  using namespace lt::cuda_emulation;
  wait_at(current_block->warp_barriers[linear_thread() / kWarpSize]);
}

// bf16 as cuda_bf16.h's __nv_bfloat16 holds it: the upper 16 bits of an f32, two bytes. The kernels
// write these bits with f32_to_bf16 (tensor/dtype.h, round to nearest even) into their own uint16_t
// buffers and hand them to wmma as __nv_bfloat16, so the emulation reads the same bytes the GPU does.
struct __nv_bfloat16 {
  uint16_t bits;
};

// The warp matrix functions of mma.h (nvcuda::wmma), the 16x16x16 shape only, for bf16 operands and f32
// accumulators. On a GPU a fragment is spread over the warp's 32 lanes in a layout CUDA leaves
// unspecified; here every lane holds the whole 16x16 tile (row-major, as f32: bf16 values are exact in
// it). That is a faithful model only for code that touches fragments through these functions alone
// (fill, load, store, mma), never through their elements by position, which is what CUDA allows a
// correct program anyway. mma_sync multiplies in f32 (products of bf16 values are exact there) and adds
// in k order; the tensor cores' order of the f32 sums is their own, so results agree to f32 rounding.
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline constexpr int kTileSide = 16;

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == kTileSide && N == kTileSide && K == kTileSide, "the emulation has the 16x16x16 shape only");
  float x[kTileSide * kTileSide];  // [row][col]
};

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float value) {
  for (float& e : f.x) e = value;
}

// An operand tile of bf16 values, element (r, c) at p[r * ldm + c] (row_major) or p[c * ldm + r].
template <class Use, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p, unsigned ldm) {
  for (int r = 0; r < kTileSide; ++r)
    for (int c = 0; c < kTileSide; ++c) {
      const size_t at = std::is_same_v<Layout, row_major> ? r * size_t{ldm} + c : c * size_t{ldm} + r;
      uint16_t bits;
      std::memcpy(&bits, p + at, sizeof bits);
      f.x[r * kTileSide + c] = lt::bf16_to_f32(bits);
    }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  for (int r = 0; r < kTileSide; ++r)
    for (int c = 0; c < kTileSide; ++c)
      p[layout == mem_row_major ? r * size_t{ldm} + c : c * size_t{ldm} + r] = f.x[r * kTileSide + c];
}

// d = a b + c (d may be c).
template <class LayoutA, class LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float sum[kTileSide * kTileSide];
  for (int r = 0; r < kTileSide; ++r)
    for (int n = 0; n < kTileSide; ++n) {
      float s = c.x[r * kTileSide + n];
      for (int k = 0; k < kTileSide; ++k) s += a.x[r * kTileSide + k] * b.x[k * kTileSide + n];
      sum[r * kTileSide + n] = s;
    }
  std::memcpy(d.x, sum, sizeof sum);
}
}  // namespace nvcuda::wmma

// The CUDA runtime pieces a kernel file's launchers use.
#ifndef LINGTRAIN_EMULATED_GPU
namespace lt::cuda_emulated {
struct DeviceGuard {
  explicit DeviceGuard(int) {}
};
}  // namespace lt::cuda_emulated
#endif
