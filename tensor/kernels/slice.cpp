// The column-slice front doors: copy a block of columns out of a matrix, or add one back in; and the
// host copies of several device tensors in one read.
#include <cstring>

#include "tensor/kernels/dispatch.h"

namespace lt::kernels {
namespace {

void check_slice(const Tensor& wide, const Tensor& narrow, int64_t start, const char* op) {
  check_float(wide, op, "matrix");
  check_like(narrow, wide, op, "slice");
  LT_CHECK(wide.ndim() >= 1 && narrow.ndim() >= 1, op, ": operands need a last dimension");
  const int64_t rows = wide.dim(-1) ? wide.numel() / wide.dim(-1) : 0;
  const int64_t narrow_rows = narrow.dim(-1) ? narrow.numel() / narrow.dim(-1) : 0;
  LT_CHECK(rows == narrow_rows, op, ": ", wide.str(), " and ", narrow.str(), " differ in rows");
  LT_CHECK(start >= 0 && start + narrow.dim(-1) <= wide.dim(-1), op, ": columns [", start, ", ", start + narrow.dim(-1),
           ") out of range for ", wide.str());
}

}  // namespace

void copy_cols(const Tensor& src, int64_t start, Tensor& dst) {
  check_slice(src, dst, start, "copy_cols");
  if constexpr (kCudaBackend) {
    if (!src.is_cpu()) return cuda::copy_cols(src, start, dst);
  }
  cpu::copy_cols(src, start, dst);
}

void add_to_cols(const Tensor& src, int64_t start, Tensor& dst) {
  check_slice(dst, src, start, "add_to_cols");
  if constexpr (kCudaBackend) {
    if (!src.is_cpu()) return cuda::add_to_cols(src, start, dst);
  }
  cpu::add_to_cols(src, start, dst);
}

void copy_to_host(const std::vector<Tensor>& sources, std::vector<Tensor>& copies) {
  const char* op = "copy_to_host";
  copies.clear();
  std::vector<Tensor> on_device;
  int64_t packed_bytes = 0;
  for (const Tensor& source : sources) {
    LT_CHECK(source.defined(), op, ": a source is undefined");
    copies.push_back(Tensor::empty(source.shape(), source.dtype(), Device::cpu()));
    if (source.is_cpu()) {
      copies.back().copy_from(source);
      continue;
    }
    if (!on_device.empty()) check_device(source, on_device.front(), op, "every source off the host");
    on_device.push_back(source);
    packed_bytes += (static_cast<int64_t>(source.nbytes()) + 7) / 8 * 8;
  }
  if (on_device.empty()) return;
  if constexpr (kCudaBackend) {
    Tensor packed = Tensor::empty({packed_bytes / 8}, DType::I64, on_device.front().device());
    cuda::pack_bytes(on_device, packed);
    const Tensor host = packed.to(Device::cpu());
    const char* bytes = static_cast<const char*>(host.raw_data());
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i].is_cpu()) continue;
      std::memcpy(copies[i].raw_data(), bytes, copies[i].nbytes());
      bytes += (copies[i].nbytes() + 7) / 8 * 8;
    }
  }
}

}  // namespace lt::kernels
