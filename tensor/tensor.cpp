#include "tensor/tensor.h"

#include <cstring>
#include <sstream>

#include "tensor/allocator.h"
#include "tensor/device_counters.h"
#include "tensor/device_runtime.h"
#include "tensor/random.h"
#include "tensor/threadpool.h"

namespace lt {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

Storage::Storage(size_t bytes, Device device)
    : data_(allocator_for(device).allocate(bytes)), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (!released_) allocator_for(device_).release(data_, bytes_);
}

void Storage::release() {
  if (released_) return;
  allocator_for(device_).release(data_, bytes_);
  data_ = nullptr;
  released_ = true;
}

void Storage::restore() {
  if (!released_) return;
  data_ = allocator_for(device_).allocate(bytes_);
  released_ = false;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) LT_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

namespace {
// The values drawn in f64 on the host by fill(values, n), then in dtype on the device.
template <class Fill>
Tensor draw_values(const Shape& shape, DType dtype, Device device, Fill fill) {
  LT_CHECK(is_floating(dtype), "random tensors must be floating point, not ", dtype_name(dtype));
  Tensor host = Tensor::empty(shape, DType::F64);
  fill(host.data<double>(), host.numel());
  return host.to(dtype).to(device);
}
}  // namespace

Tensor Tensor::randn(const Shape& shape, Rng& rng, double std, DType dtype, Device device) {
  return draw_values(shape, dtype, device, [&](double* values, int64_t n) {
    rng.fill_normal(values, n);
    parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) values[i] *= std;
    });
  });
}

Tensor Tensor::uniform(const Shape& shape, Rng& rng, double lo, double hi, DType dtype, Device device) {
  return draw_values(shape, dtype, device, [&](double* values, int64_t n) {
    for (int64_t i = 0; i < n; ++i) values[i] = lo + (hi - lo) * rng.uniform();
  });
}

template <class T>
Tensor Tensor::from_vector(const Shape& shape, const std::vector<T>& values, Device device) {
  LT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values for shape ", shape_str(shape));
  Tensor host = empty(shape, dtype_of<T>());
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  return host.to(device);
}
template Tensor Tensor::from_vector<float>(const Shape&, const std::vector<float>&, Device);
template Tensor Tensor::from_vector<double>(const Shape&, const std::vector<double>&, Device);
template Tensor Tensor::from_vector<int32_t>(const Shape&, const std::vector<int32_t>&, Device);
template Tensor Tensor::from_vector<int64_t>(const Shape&, const std::vector<int64_t>&, Device);

int64_t Tensor::dim(int axis) const {
  const int n = ndim();
  if (axis < 0) axis += n;
  LT_CHECK(axis >= 0 && axis < n, "axis ", axis, " out of range for shape ", shape_str(shape_));
  return shape_[axis];
}

std::string Tensor::str() const {
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + device().str();
}

void* Tensor::raw_data() const {
  LT_CHECK(defined(), "use of an undefined tensor");
  LT_CHECK(!storage_->released(), "use of a tensor whose memory is released (a sharded parameter outside its uses)");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape resolved = shape;
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      LT_CHECK(inferred < 0, "reshape: more than one -1 in ", shape_str(shape));
      inferred = static_cast<int>(i);
    } else {
      known *= resolved[i];
    }
  }
  if (inferred >= 0) {
    LT_CHECK(known > 0 && numel() % known == 0, "reshape: cannot infer ", shape_str(shape), " from ", str());
    resolved[inferred] = numel() / known;
  }
  LT_CHECK(shape_numel(resolved) == numel(), "reshape: ", str(), " cannot become ", shape_str(shape));
  Tensor view = *this;
  view.shape_ = resolved;
  return view;
}

Tensor Tensor::narrow(int64_t start, int64_t length) const {
  LT_CHECK(ndim() >= 1 && start >= 0 && length >= 0 && start + length <= shape_[0], "narrow(", start, ", ", length,
           ") out of range for ", str());
  Tensor view = *this;
  view.shape_[0] = length;
  view.offset_ += start * (numel() / std::max<int64_t>(shape_[0], 1));
  return view;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_, device());
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(Device target) const {
  if (device() == target) return *this;
  Tensor out = empty(shape_, dtype_, target);
  out.copy_from(*this);
  return out;
}

namespace {
double load_as_double(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::F32: return t.data<float>()[i];
    case DType::F64: return t.data<double>()[i];
    case DType::BF16: return bf16_to_f32(t.bf16_data()[i]);
    case DType::I32: return t.data<int32_t>()[i];
    case DType::I64: return static_cast<double>(t.data<int64_t>()[i]);
  }
  return 0;
}
void store_double(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::F32: t.data<float>()[i] = static_cast<float>(v); break;
    case DType::F64: t.data<double>()[i] = v; break;
    case DType::BF16: t.bf16_data()[i] = f32_to_bf16(static_cast<float>(v)); break;
    case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(v); break;
    case DType::I64: t.data<int64_t>()[i] = static_cast<int64_t>(v); break;
  }
}
}  // namespace

Tensor Tensor::to(DType target) const {
  if (target == dtype_) return *this;
  if (!is_cpu()) {
    if constexpr (kCudaBackend) {
      Tensor out = empty(shape_, target, device());
      cuda::convert_dtype(*this, out);
      return out;
    }
  }
  Tensor out = empty(shape_, target);
  const int64_t n = numel();
  if (dtype_ == DType::F32 && target == DType::BF16) {
    // The common case (weights to bf16) without the double round trip, which would round twice.
    const float* src = data<float>();
    uint16_t* dst = out.bf16_data();
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    return out;
  }
  for (int64_t i = 0; i < n; ++i) store_double(out, i, load_as_double(*this, i));
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  LT_CHECK(src.shape_ == shape_ && src.dtype_ == dtype_, "copy_from: ", src.str(), " into ", str());
  if (nbytes() == 0) return;
  if (is_cpu() && src.is_cpu()) {
    std::memcpy(raw_data(), src.raw_data(), nbytes());
    return;
  }
  if constexpr (kCudaBackend) {
    device_count::copy(device(), src.device(), nbytes());
    return cuda::copy_bytes(raw_data(), device(), src.raw_data(), src.device(), nbytes());
  }
  fail("copy_from: CUDA tensors in a build without CUDA");
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  const Tensor host = to(Device::cpu());
  const T* values = host.data<T>();
  return std::vector<T>(values, values + numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;

double Tensor::item() const {
  LT_CHECK(numel() == 1, "item() of ", str(), " which holds ", numel(), " elements");
  return load_as_double(to(Device::cpu()), 0);
}

void Tensor::fill_(double value) {
  if (!is_cpu()) {
    if constexpr (kCudaBackend) return cuda::fill(*this, value);
    fail("fill_: CUDA tensors in a build without CUDA");
  }
  const int64_t n = numel();
  if (value == 0.0) {
    std::memset(raw_data(), 0, nbytes());
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_double(*this, i, value);
}

}  // namespace lt
