// Tensor: a shape, a dtype and a view into reference-counted storage on one device.
//
// Tensors are row-major and contiguous. A view (reshape, a range of the leading dimension) shares the
// storage and differs only in shape and element offset; there are no general strides. Ops that need
// a transpose take it as an argument, as BLAS does.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/device.h"
#include "tensor/dtype.h"
#include "tensor/error.h"

namespace lt {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);

// Bytes on one device, returned to that device's caching allocator when the last tensor lets go.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // Parameter sharding (dist/parameter_shards.h) keeps a layer's gathered weights only around their uses:
  // release() gives the memory back to the allocator while the tensors that view it (the parameters, the
  // nodes that saved them) stay; restore() takes memory of the same size again, its contents undefined.
  // A use of a released storage's data is an error.
  void release();
  void restore();
  bool released() const { return released_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  bool released_ = false;
};

class Rng;

class Tensor {
 public:
  Tensor() = default;  // undefined: no storage

  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
  static Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::cpu());
  // Normal(0, std) / Uniform(lo, hi) values drawn on the CPU from `rng` in element order (so the
  // result depends on the seed only), then moved to `device`.
  static Tensor randn(const Shape& shape, Rng& rng, double std = 1.0, DType dtype = DType::F32,
                      Device device = Device::cpu());
  static Tensor uniform(const Shape& shape, Rng& rng, double lo, double hi, DType dtype = DType::F32,
                        Device device = Device::cpu());
  template <class T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const;  // negative axes count from the end
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  bool is_cpu() const { return device().is_cpu(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  std::string str() const;  // "f32[2, 3] cpu"

  void* raw_data() const;
  template <class T>
  T* data() const {
    LT_CHECK(dtype_of<T>() == dtype_, "tensor holds ", dtype_name(dtype_), ", asked for ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw_data());
  }
  uint16_t* bf16_data() const {
    LT_CHECK(dtype_ == DType::BF16, "tensor holds ", dtype_name(dtype_), ", asked for bf16");
    return static_cast<uint16_t*>(raw_data());
  }

  // Views sharing storage.
  Tensor reshape(const Shape& shape) const;     // one entry may be -1
  Tensor narrow(int64_t start, int64_t length) const;  // a range of the leading dimension
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  // No other tensor (a copy or a view) holds this one's storage: a write to it is seen by no one else.
  bool sole_owner() const { return storage_.use_count() == 1; }
  // The storage's memory, for parameter sharding (Storage::release): shared by every view of it.
  Storage& storage() const { return *storage_; }

  // Copies.
  Tensor clone() const;
  Tensor to(Device device) const;  // same tensor if already there
  Tensor to(DType dtype) const;    // converts on the CPU; bf16 rounds to nearest even
  void copy_from(const Tensor& src);  // same shape and dtype, any devices
  template <class T>
  std::vector<T> to_vector() const;  // host copy of the elements
  double item() const;                // the value of a one-element floating tensor

  void fill_(double value);
  void zero_() { fill_(0.0); }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::F32;
};

}  // namespace lt
