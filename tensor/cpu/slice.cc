// Column slices of a row-major matrix: copy a block of columns out, or add one back in.
#include <algorithm>
#include <cstring>

#include "tensor/cpu/kernels.h"
#include "tensor/dtype_switch.h"
#include "tensor/threadpool.h"

namespace lt::cpu {

void copy_cols(const Tensor& src, int64_t start, Tensor& dst) {
  const int64_t C = src.dim(-1), W = dst.dim(-1), rows = dst.numel() / std::max<int64_t>(W, 1);
  const size_t elem = dtype_size(src.dtype());
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst.raw_data());
  parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) std::memcpy(d + r * W * elem, s + (r * C + start) * elem, W * elem);
  });
}

void add_to_cols(const Tensor& src, int64_t start, Tensor& dst) {
  const int64_t C = dst.dim(-1), W = src.dim(-1), rows = src.numel() / std::max<int64_t>(W, 1);
  LT_FLOAT_SWITCH(src.dtype(), T, {
    const T* s = src.data<T>();
    T* d = dst.data<T>();
    parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        for (int64_t j = 0; j < W; ++j) d[r * C + start + j] += s[r * W + j];
    });
  });
}

}  // namespace lt::cpu
