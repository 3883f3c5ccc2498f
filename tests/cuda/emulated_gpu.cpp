// An emulated GPU, for the tests of machines without one: linked into lingtrain_emulated_gpu_tests in
// place of the CUDA backend's device code, it makes cuda:0 a device whose memory is host memory and
// whose kernels are the hand-written .cu files compiled as plain C++ through tensor/cuda/emulation.h.
// Every front door then takes its CUDA branch, so the GPU table (tests/cuda/test_cuda.cpp) and a whole
// training step on cuda:0 (tests/trainer/test_trainer_gpu.cpp) run here through every CUDA kernel,
// with the host copies, device-side index checks and device placement of a real GPU run.
//
// What it cannot show: speed, a host read of device memory (here it works; on a GPU it crashes), the
// memory model of real hardware, and cuBLAS, whose GEMMs are stood in for by the CPU's.
//
// The linker takes lt::cuda's runtime functions (those the core declares in tensor/device_runtime.h) and
// kernels from this object, so it pulls none of the real backend's objects out of lt_tensor (a symbol
// defined twice would fail the link, not pass).
#include <cstdlib>
#include <cstring>
#include <string>

#include "tensor/allocator.h"
#include "tensor/cpu/kernels.h"
#include "tensor/device.h"
#include "tensor/device_counters.h"
#include "tensor/device_runtime.h"

// tensor/cuda/cuda_runtime.h's DeviceGuard, token for token: that header brings the CUDA toolkit's own
// runtime types, which the emulation replaces, so the class is declared here again.
namespace lt::cuda {
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};
}  // namespace lt::cuda

// The kernels into lt::cuda (the emulation must come first).
// clang-format off
#define LINGTRAIN_CUDA_EMULATION 1
#define LINGTRAIN_EMULATED_GPU 1
#include "tensor/cuda/emulation.h"
#include "tensor/cuda/activation.cu"
#include "tensor/cuda/adamw.cu"
#include "tensor/cuda/attention.cu"
#include "tensor/cuda/attention_decode.cu"
#include "tensor/cuda/dpo.cu"
#include "tensor/cuda/elementwise.cu"
#include "tensor/cuda/index.cu"
#include "tensor/cuda/moe.cu"
#include "tensor/cuda/moe_stats.cu"
#include "tensor/cuda/norm.cu"
#include "tensor/cuda/normhead.cu"
#include "tensor/cuda/reduce.cu"
#include "tensor/cuda/rope.cu"
#include "tensor/cuda/slice.cu"
#include "tensor/cuda/softmax.cu"
// clang-format on

namespace lt::cuda {

// One device, always current.
DeviceGuard::DeviceGuard(int index) : previous_(index) {}
DeviceGuard::~DeviceGuard() = default;

int device_count() { return 1; }

std::string device_description(int) { return "emulated on the CPU (tests/cuda/emulated_gpu.cpp)"; }

namespace {
// Device blocks on the host, 64-byte aligned as the CPU allocator's are.
void* device_malloc(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
void device_free(void* ptr) { std::free(ptr); }
}  // namespace

CachingAllocator& device_allocator(int index) {
  LT_CHECK(index == 0, "cuda:", index, " is not a usable device: the one emulated CUDA device is cuda:0");
  static CachingAllocator allocator(device_malloc, device_free, Device::cuda(0));
  return allocator;
}

void copy_bytes(void* dst, Device, const void* src, Device, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

// cuBLAS's part: the CPU GEMM on the same (host) memory. Mixed precision takes the bf16 operands a real
// run takes (bf16_operand: a weight's copy, else round_to_bf16), widened back to f32, which an f32 GEMM
// then multiplies exactly and sums in f32, as the tensor cores do.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision) {
  // Counted as tensor/cuda/gemm.cu's calls are: one cuBLAS call, or with nothing to sum one kernel.
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  if (K == 0) device_count::launch();
  else device_count::blas_call(2 * static_cast<uint64_t>(c.numel()) * static_cast<uint64_t>(K));
  if (precision == MatmulPrecision::F32 || a.dtype() != DType::F32)
    return cpu::matmul(a, trans_a, b, trans_b, c, alpha, beta, MatmulPrecision::F32);
  auto rounded = [](const Tensor& x) {
    const Tensor x16 = bf16_operand(x);
    // The device's bytes are host bytes: read without a counted copy (cuBLAS reads them on the device).
    Tensor host16 = Tensor::empty(x.shape(), DType::BF16, Device::cpu());
    std::memcpy(host16.raw_data(), x16.raw_data(), x16.nbytes());
    return host16.to(DType::F32);
  };
  cpu::matmul(rounded(a), trans_a, rounded(b), trans_b, c, alpha, beta, MatmulPrecision::F32);
}

}  // namespace lt::cuda

#include "tensor/cuda/grouped_matmul.h"  // IWYU pragma: keep (the grouped GEMMs over the matmul above)
