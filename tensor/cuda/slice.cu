// Column-slice CUDA kernels: copy a block of columns out of a matrix, or add one back in, with the CPU
// kernels' results (tensor/cpu/slice.cc). One thread per element of the narrow side; each element of
// the wide side is written by at most one thread, so no atomics. And the packing of several tensors'
// bytes into one buffer, which the host then reads in one copy (kernels::copy_to_host).
#include <algorithm>
#include <cstdint>

#ifndef LINGTRAIN_CUDA_EMULATION  // the emulation (tensor/cuda/emulation.h) stands in for the runtime
#include "tensor/cuda/cuda_runtime.h"
#endif
#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/dtype_switch.h"

namespace lt::LT_CUDA_NAMESPACE {
namespace {

// Narrow element i (row i / W, column i % W) sits at wide column start + i % W of width C.
__device__ inline int64_t wide_index(int64_t i, int64_t W, int64_t C, int64_t start) {
  return (i / W) * C + start + i % W;
}

template <class Word>
__global__ void copy_cols_kernel(const Word* src, int64_t C, int64_t start, Word* dst, int64_t W, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[i] = src[wide_index(i, W, C, start)];
}

template <class T>
__global__ void add_to_cols_kernel(const T* src, int64_t W, int64_t start, T* dst, int64_t C, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) dst[wide_index(i, W, C, start)] += src[i];
}

template <class Word>
void launch_copy_cols(const Tensor& src, int64_t start, Tensor& dst) {
  const int64_t n = dst.numel();
  LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, copy_cols_kernel<Word>)(
      static_cast<const Word*>(src.raw_data()), src.dim(-1), start, static_cast<Word*>(dst.raw_data()), dst.dim(-1), n);
}

// Up to kPackSources sources, passed by value (1 KiB of kernel parameters, far below the limit).
struct PackList {
  const unsigned char* source[kPackSources];
  int64_t bytes[kPackSources];
  int64_t offset[kPackSources];
};

// One block per source, its threads striding over the bytes: the sources are a step's statistics, a
// few bytes to a few KiB each.
__global__ void pack_bytes_kernel(PackList list, unsigned char* packed) {
  const int s = static_cast<int>(blockIdx.x);
  for (int64_t i = threadIdx.x; i < list.bytes[s]; i += blockDim.x) packed[list.offset[s] + i] = list.source[s][i];
}

}  // namespace

void pack_bytes(const std::vector<Tensor>& sources, Tensor& packed) {
  if (sources.empty()) return;
  const DeviceGuard guard(packed.device().index);
  int64_t offset = 0;
  for (size_t first = 0; first < sources.size(); first += kPackSources) {
    PackList list{};
    const int count = static_cast<int>(std::min<size_t>(kPackSources, sources.size() - first));
    for (int i = 0; i < count; ++i) {
      const Tensor& source = sources[first + static_cast<size_t>(i)];
      list.source[i] = static_cast<const unsigned char*>(source.raw_data());
      list.bytes[i] = static_cast<int64_t>(source.nbytes());
      list.offset[i] = offset;
      offset += (list.bytes[i] + 7) / 8 * 8;
    }
    LT_CUDA_LAUNCH(static_cast<unsigned>(count), kThreadsPerBlock, pack_bytes_kernel)(
        list, static_cast<unsigned char*>(packed.raw_data()));
  }
  LT_CUDA_CHECK(cudaGetLastError());
}

void copy_cols(const Tensor& src, int64_t start, Tensor& dst) {
  if (dst.numel() == 0) return;
  const DeviceGuard guard(src.device().index);
  // A copy moves bits: the element's width is all that matters.
  switch (dtype_size(src.dtype())) {
    case 2:
      launch_copy_cols<uint16_t>(src, start, dst);
      break;
    case 4:
      launch_copy_cols<uint32_t>(src, start, dst);
      break;
    default:
      launch_copy_cols<uint64_t>(src, start, dst);
      break;
  }
  LT_CUDA_CHECK(cudaGetLastError());
}

void add_to_cols(const Tensor& src, int64_t start, Tensor& dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  const DeviceGuard guard(src.device().index);
  LT_FLOAT_SWITCH(src.dtype(), T, {
    LT_CUDA_LAUNCH(blocks_for(n), kThreadsPerBlock, add_to_cols_kernel<T>)(
        src.data<T>(), src.dim(-1), start, dst.data<T>(), dst.dim(-1), n);
  });
  LT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace lt::LT_CUDA_NAMESPACE
