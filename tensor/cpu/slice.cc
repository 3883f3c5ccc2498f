// Column slices of a row-major matrix: copy a block of columns out, or add one back in.
#include <cstring>

#include "tensor/cpu/kernel_util.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

namespace lt::kernels {
namespace {

void check_slice(const Tensor& wide, const Tensor& narrow, int64_t start, const char* op) {
  check_float(wide, op, "matrix");
  check_like(narrow, wide, op, "slice");
  LT_CHECK(wide.ndim() >= 1 && narrow.ndim() >= 1, op, ": operands need a last dimension");
  const int64_t rows = wide.dim(-1) ? wide.numel() / wide.dim(-1) : 0;
  const int64_t narrow_rows = narrow.dim(-1) ? narrow.numel() / narrow.dim(-1) : 0;
  LT_CHECK(rows == narrow_rows, op, ": ", wide.str(), " and ", narrow.str(), " differ in rows");
  LT_CHECK(start >= 0 && start + narrow.dim(-1) <= wide.dim(-1), op, ": columns [", start, ", ",
           start + narrow.dim(-1), ") out of range for ", wide.str());
  require_cpu(wide, op);
}

}  // namespace

void copy_cols(const Tensor& src, int64_t start, Tensor& dst) {
  check_slice(src, dst, start, "copy_cols");
  const int64_t C = src.dim(-1), W = dst.dim(-1), rows = dst.numel() / std::max<int64_t>(W, 1);
  const size_t elem = dtype_size(src.dtype());
  const char* s = static_cast<const char*>(src.raw_data());
  char* d = static_cast<char*>(dst.raw_data());
  parallel_for(rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) std::memcpy(d + r * W * elem, s + (r * C + start) * elem, W * elem);
  });
}

void add_to_cols(const Tensor& src, int64_t start, Tensor& dst) {
  check_slice(dst, src, start, "add_to_cols");
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

}  // namespace lt::kernels
