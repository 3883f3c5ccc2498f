// The CUDA backend. The CudaBuild tests run on every machine: the build flag, a device query that
// cannot crash without a driver, clean errors. The CudaKernels tests compare each CUDA kernel with the
// CPU kernel on the same inputs and skip where no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/kernels.h"
#include "tests/test_util.h"

#ifdef LINGTRAIN_CUDA
#include "tensor/cuda/cuda_runtime.h"
#endif

namespace lt {
namespace {

using test::expect_close;
using test::random_tensor;

TEST(CudaBuild, CompiledFlagMatchesTheBuild) {
#ifdef LINGTRAIN_CUDA
  EXPECT_TRUE(cuda_compiled());
#else
  EXPECT_FALSE(cuda_compiled());
#endif
}

TEST(CudaBuild, DeviceCountIsSafeToQuery) {
  const int count = cuda_device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(cuda_device_count(), count);
  if (!cuda_compiled()) {
    EXPECT_EQ(count, 0);
  }
}

TEST(CudaBuild, TensorOnAMissingDeviceIsAnError) {
  // cuda:<count> never exists; on a machine without a GPU, or a build without CUDA, that is cuda:0.
  const int missing = cuda_device_count();
  try {
    Tensor::empty({4}, DType::F32, Device::cuda(missing));
    ADD_FAILURE() << "creating a tensor on cuda:" << missing << " did not fail";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("CUDA"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  // The failure left no sticky state behind.
  EXPECT_EQ(cuda_device_count(), missing);
}

#ifdef LINGTRAIN_CUDA
TEST(CudaBuild, RuntimeCountMatchesPublicCount) { EXPECT_EQ(cuda::device_count(), cuda_device_count()); }

TEST(CudaBuild, CudaErrorsBecomeOneLine) {
  try {
    LT_CUDA_CHECK(cudaErrorInvalidValue);
    ADD_FAILURE() << "LT_CUDA_CHECK did not throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("test_cuda.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find("cudaErrorInvalidValue"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  try {
    LT_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    ADD_FAILURE() << "LT_CUBLAS_CHECK did not throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cuBLAS"), std::string::npos) << message;
    EXPECT_NE(message.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << message;
  }
}
#endif

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (or no driver) on this machine";
  }
  static Device gpu() { return Device::cuda(0); }
};

// The bytes of a tensor, copied to the host.
std::vector<unsigned char> host_bytes(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  std::vector<unsigned char> bytes(host.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), host.raw_data(), bytes.size());
  return bytes;
}

TEST_F(CudaKernels, CopiesRoundTripBitForBit) {
  for (const DType dtype : {DType::F32, DType::F64, DType::BF16}) {
    for (const Shape& shape : {Shape{0}, Shape{1}, Shape{7, 33}, Shape{3, 1000}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(shape));
      const Tensor host = random_tensor(shape, 11, DType::F32).to(dtype);
      const Tensor device = host.to(gpu());
      EXPECT_EQ(device.device(), gpu());
      EXPECT_EQ(host_bytes(device), host_bytes(host));   // host -> device -> host
      EXPECT_EQ(host_bytes(device.clone()), host_bytes(host));  // device -> device
      Tensor target = Tensor::empty(shape, dtype, gpu());
      target.copy_from(host);
      EXPECT_EQ(host_bytes(target), host_bytes(host));
      if (shape.size() == 2) {  // a view starting inside the storage
        EXPECT_EQ(host_bytes(device.narrow(1, shape[0] - 1)), host_bytes(host.narrow(1, shape[0] - 1)));
      }
    }
  }
  const std::vector<int64_t> ids{0, -1, 1LL << 40, 42};
  EXPECT_EQ(Tensor::from_vector<int64_t>({4}, ids, gpu()).to_vector<int64_t>(), ids);
  const std::vector<int32_t> small_ids{3, -7, 1 << 30};
  EXPECT_EQ(Tensor::from_vector<int32_t>({3}, small_ids, gpu()).to_vector<int32_t>(), small_ids);
}

TEST_F(CudaKernels, CopiesBetweenDevices) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Tensor host = random_tensor({5, 77}, 12);
  const Tensor on_first = host.to(gpu());
  const Tensor on_second = on_first.to(Device::cuda(1));
  EXPECT_EQ(on_second.device(), Device::cuda(1));
  EXPECT_EQ(host_bytes(on_second), host_bytes(host));
  EXPECT_EQ(host_bytes(on_second.to(gpu())), host_bytes(host));
}

TEST_F(CudaKernels, FillMatchesCpu) {
  for (const DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64}) {
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{257}, int64_t{100003}}) {
      for (const double value : {2.5, -3.0, 1e-3, 0.0, -0.0, 7e5}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " n=" + std::to_string(n) + " value=" + std::to_string(value));
        Tensor device = Tensor::full({n}, 99.0, dtype, gpu());  // every element must be overwritten
        device.fill_(value);
        EXPECT_EQ(host_bytes(device), host_bytes(Tensor::full({n}, value, dtype)));
      }
    }
  }
  Tensor zeros = Tensor::zeros({3, 5}, DType::F32, gpu());
  EXPECT_EQ(zeros.to_vector<float>(), std::vector<float>(15, 0.0f));
}

template <class T>
void check_binary_matches_cpu(DType dtype, Device gpu) {
  for (const auto& [a_shape, b_shape] : std::vector<std::pair<Shape, Shape>>{
           {{1}, {1}}, {{3, 17}, {17}}, {{129}, {129}}, {{5, 3, 129}, {3, 129}}, {{2, 1000}, {1000}}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(a_shape) + " op " + shape_str(b_shape));
    const Tensor a = random_tensor(a_shape, 1, dtype), b = random_tensor(b_shape, 2, dtype);
    const Tensor a_gpu = a.to(gpu), b_gpu = b.to(gpu);
    Tensor out = Tensor::empty_like(a), out_gpu = Tensor::empty_like(a_gpu);
    kernels::add(a, b, out);
    kernels::add(a_gpu, b_gpu, out_gpu);
    expect_close(out_gpu.to_vector<T>(), out.to_vector<T>(), 0, 0, "add");
    kernels::sub(a, b, out);
    kernels::sub(a_gpu, b_gpu, out_gpu);
    expect_close(out_gpu.to_vector<T>(), out.to_vector<T>(), 0, 0, "sub");
    kernels::mul(a, b, out);
    kernels::mul(a_gpu, b_gpu, out_gpu);
    expect_close(out_gpu.to_vector<T>(), out.to_vector<T>(), 0, 0, "mul");
    // In place: out is a.
    Tensor in_place = a_gpu.clone();
    kernels::add(in_place, b_gpu, in_place);
    kernels::add(a, b, out);
    expect_close(in_place.to_vector<T>(), out.to_vector<T>(), 0, 0, "add in place");
  }
}

TEST_F(CudaKernels, BinaryMatchesCpu) {
  check_binary_matches_cpu<float>(DType::F32, gpu());
  check_binary_matches_cpu<double>(DType::F64, gpu());
  // Operands on different devices are an error, not a read of device memory on the host.
  const Tensor a = random_tensor({4}, 3), b = random_tensor({4}, 4);
  Tensor out = Tensor::empty({4}, DType::F32, gpu());
  EXPECT_THROW(kernels::add(a.to(gpu()), b, out), Error);
}

template <class T>
void check_axpby_matches_cpu(DType dtype, Device gpu, double tolerance) {
  for (const Shape& shape : {Shape{1}, Shape{1000}, Shape{3, 4099}}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(shape));
    const Tensor x = random_tensor(shape, 5, dtype), y = random_tensor(shape, 6, dtype);
    const Tensor x_gpu = x.to(gpu);

    Tensor scaled = Tensor::empty_like(x);
    kernels::scale(x, 0.37, scaled);
    // scale only writes its output: NaN already there must not leak into the result.
    Tensor scaled_gpu = Tensor::full(shape, std::numeric_limits<double>::quiet_NaN(), dtype, gpu);
    kernels::scale(x_gpu, 0.37, scaled_gpu);
    expect_close(scaled_gpu.to_vector<T>(), scaled.to_vector<T>(), tolerance, tolerance, "scale");

    Tensor updated = y.clone(), updated_gpu = y.to(gpu);
    kernels::axpy(-1.5, x, updated);
    kernels::axpy(-1.5, x_gpu, updated_gpu);
    expect_close(updated_gpu.to_vector<T>(), updated.to_vector<T>(), tolerance, tolerance, "axpy");
  }
}

TEST_F(CudaKernels, ScaleAndAxpyMatchCpu) {
  check_axpby_matches_cpu<float>(DType::F32, gpu(), 1e-6);
  check_axpby_matches_cpu<double>(DType::F64, gpu(), 1e-14);
}

template <class T>
void check_matmul_matches_cpu(DType dtype, Device gpu, double tolerance) {
  struct Case {
    int64_t G, M, N, K;  // G == 0: 2-D a
    bool b_batched;
  };
  const std::vector<Case> cases{
      {0, 13, 17, 19, false},  // plain 2-D
      {0, 1, 1, 1, false},     // degenerate
      {3, 5, 9, 7, true},      // batched a and b
      {4, 6, 11, 8, false},    // batched a, one shared b (tall GEMM, or stride 0 when a is transposed)
      {0, 4, 6, 0, false},     // K = 0: c = beta * c
  };
  for (const Case& cs : cases) {
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        for (const auto& [alpha, beta] : std::vector<std::pair<double, double>>{{1.0, 0.0}, {1.5, 0.5}}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " G=" + std::to_string(cs.G) + " M=" + std::to_string(cs.M) +
                       " N=" + std::to_string(cs.N) + " K=" + std::to_string(cs.K) + " trans_a=" +
                       std::to_string(trans_a) + " trans_b=" + std::to_string(trans_b) +
                       " beta=" + std::to_string(beta));
          Shape a_shape = trans_a ? Shape{cs.K, cs.M} : Shape{cs.M, cs.K};
          Shape b_shape = trans_b ? Shape{cs.N, cs.K} : Shape{cs.K, cs.N};
          Shape c_shape{cs.M, cs.N};
          if (cs.G > 0) {
            a_shape.insert(a_shape.begin(), cs.G);
            c_shape.insert(c_shape.begin(), cs.G);
            if (cs.b_batched) b_shape.insert(b_shape.begin(), cs.G);
          }
          const Tensor a = random_tensor(a_shape, 7, dtype), b = random_tensor(b_shape, 8, dtype);
          // beta == 0 must not read c, so the GPU c starts as NaN; otherwise both start from the same c.
          Tensor c = random_tensor(c_shape, 9, dtype);
          Tensor c_gpu = beta == 0.0 ? Tensor::full(c_shape, std::numeric_limits<double>::quiet_NaN(), dtype, gpu)
                                     : c.to(gpu);
          kernels::matmul(a, trans_a, b, trans_b, c, alpha, beta);
          kernels::matmul(a.to(gpu), trans_a, b.to(gpu), trans_b, c_gpu, alpha, beta);
          expect_close(c_gpu.to_vector<T>(), c.to_vector<T>(), tolerance, tolerance, "matmul");
        }
      }
    }
  }
}

TEST_F(CudaKernels, MatmulMatchesCpu) {
  check_matmul_matches_cpu<float>(DType::F32, gpu(), 1e-5);
  check_matmul_matches_cpu<double>(DType::F64, gpu(), 1e-12);
}

TEST_F(CudaKernels, CachingAllocatorReusesDeviceBlocks) {
  CachingAllocator& allocator = allocator_for(gpu());
  void* first_block = nullptr;
  {
    const Tensor t = Tensor::empty({1000}, DType::F32, gpu());
    first_block = t.raw_data();
  }
  const AllocatorStats before = allocator.stats();
  {
    // The same size class again: the cached block comes back and the system is not asked.
    const Tensor t = Tensor::empty({999}, DType::F32, gpu());
    EXPECT_EQ(t.raw_data(), first_block);
    EXPECT_EQ(allocator.stats().system_allocs, before.system_allocs);
    EXPECT_EQ(allocator.stats().bytes_in_use, before.bytes_in_use + CachingAllocator::size_class(999 * 4));
  }
  EXPECT_EQ(allocator.stats().bytes_in_use, before.bytes_in_use);
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().bytes_reserved, allocator.stats().bytes_in_use);
}

}  // namespace
}  // namespace lt
