// Running the hand-written CUDA kernels on the CPU, for the tests of machines without a GPU.
//
// A test translation unit defines LINGTRAIN_CUDA_EMULATION, includes this header and then a .cu file:
// the file compiles as plain C++, its kernels and their Tensor-level launchers land in namespace
// lt::cuda_emulated (LT_CUDA_NAMESPACE), and they run on CPU tensors, so each kernel's arithmetic and
// indexing (grid-stride loops, partial tiles, odd sizes) is compared with the CPU kernel in CTest. What
// this cannot show: speed, the memory model of real hardware, and cuBLAS (not emulated).
//
// The model of execution, as CUDA defines it for correct programs:
//   - blocks run one after another; a block's threads are real threads that run concurrently;
//   - a kernel that throws (an LT_CHECK inside device code) ends the test: nothing is caught;
//   - __shared__ variables are static locals: one instance, shared by the threads of the running block;
//   - __syncthreads() is a barrier across the block's threads;
//   - warp shuffles exchange values among the 32 threads of a warp, all of which must take part (as
//     the *_sync intrinsics require with a full mask).
#pragma once
#ifndef LINGTRAIN_CUDA_EMULATION
#error "tensor/cuda/emulation.h is for the CPU emulation of the CUDA kernels (define LINGTRAIN_CUDA_EMULATION)"
#endif

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

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

// kernel<<<grid, block>>>(args...) as a call the emulator runs.
#define LT_CUDA_LAUNCH(grid, block, ...)                                                         \
  [&](auto&&... lt_launch_args) {                                                                \
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
inline cudaError_t cudaMemsetAsync(void* data, int value, size_t bytes, void* /*stream*/) {
  std::memset(data, value, bytes);
  return cudaSuccess;
}
#define LT_CUDA_CHECK(call) LT_CHECK((call) == cudaSuccess, "emulated CUDA call failed: ", #call)

namespace lt::cuda_emulation {

inline constexpr unsigned kWarpSize = 32;

// What the threads of the running block share: the block barrier and each warp's exchange slots.
struct Block {
  explicit Block(unsigned threads)
      : barrier(threads), warp_values(threads) {
    for (unsigned w = 0; w < (threads + kWarpSize - 1) / kWarpSize; ++w)
      warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(kWarpSize, threads - w * kWarpSize)));
  }
  std::barrier<> barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
  std::vector<double> warp_values;  // one slot per thread; shuffled values travel as double (exact for f32, f64, i32)
};
inline thread_local Block* current_block = nullptr;

// Runs `body` (one kernel launch with its arguments bound) for every thread of every block. The block's
// threads are started once and walk the blocks together; the barrier at each block's end keeps the
// next block's writes to __shared__ memory from meeting the last reads of the previous one.
inline void run_grid(dim3 grid, dim3 block, const std::function<void()>& body) {
  const unsigned threads = block.x * block.y * block.z;
  LT_CHECK(threads >= 1 && threads <= 1024, "emulated launch: ", threads, " threads per block (1 to 1024)");
  Block shared(threads);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      threadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
      blockDim = block;
      gridDim = grid;
      current_block = &shared;
      for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
          for (unsigned bx = 0; bx < grid.x; ++bx) {
            blockIdx = dim3(bx, by, bz);
            body();
            shared.barrier.arrive_and_wait();
          }
    });
  for (std::thread& thread : pool) thread.join();
}

inline unsigned linear_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// Every thread of the warp publishes its value, then reads its partner's; the second barrier keeps a
// fast thread from overwriting its slot before the slow ones have read.
template <class T>
T shuffle(T value, unsigned partner_lane) {
  Block& b = *current_block;
  const unsigned me = linear_thread(), warp = me / kWarpSize;
  std::barrier<>& sync = *b.warp_barriers[warp];
  b.warp_values[me] = static_cast<double>(value);
  sync.arrive_and_wait();
  const unsigned partner = warp * kWarpSize + partner_lane;
  const T result = partner < b.warp_values.size() && partner_lane < kWarpSize ? static_cast<T>(b.warp_values[partner]) : value;
  sync.arrive_and_wait();
  return result;
}

}  // namespace lt::cuda_emulation

inline void __syncthreads() { lt::cuda_emulation::current_block->barrier.arrive_and_wait(); }

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

// The CUDA runtime pieces a kernel file's launchers use.
#ifndef LINGTRAIN_EMULATED_GPU
namespace lt::cuda_emulated {
struct DeviceGuard {
  explicit DeviceGuard(int) {}
};
}  // namespace lt::cuda_emulated
#endif
