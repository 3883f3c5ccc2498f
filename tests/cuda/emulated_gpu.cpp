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
#include "tensor/cuda/grouped_gemm_bf16.cu"
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

namespace {

// An operand as the CPU GEMM multiplies it: f32 and f64 as they are (the device's bytes are host bytes),
// bf16 widened (exactly) from a host copy read without a counted copy, as cuBLAS reads it on the device.
Tensor multiplied(const Tensor& x) {
  if (x.dtype() != DType::BF16) return x;
  Tensor host16 = Tensor::empty(x.shape(), DType::BF16, Device::cpu());
  std::memcpy(host16.raw_data(), x.raw_data(), x.nbytes());
  return host16.to(DType::F32);
}

// The rows [.., `rows`) of operand x (row-major, contiguous) that start at `address`.
Tensor rows_at(const Tensor& x, int64_t address, int64_t rows) {
  const int64_t cols = x.dim(-1), row_bytes = cols * static_cast<int64_t>(dtype_size(x.dtype()));
  const int64_t offset = address - static_cast<int64_t>(reinterpret_cast<intptr_t>(x.raw_data()));
  const int64_t total_rows = x.numel() / cols;
  LT_CHECK(offset >= 0 && offset % row_bytes == 0 && offset / row_bytes + rows <= total_rows,
           "emulated grouped GEMM: an address ", offset, " bytes into an operand of ", total_rows, " rows of ",
           row_bytes, " bytes, for ", rows, " rows");
  return x.reshape({total_rows, cols}).narrow(offset / row_bytes, rows);
}

}  // namespace

// cuBLAS's part: the CPU GEMM on the same (host) memory. Mixed precision takes the bf16 operands a real
// run takes (bf16_operand: a weight's copy, else round_to_bf16), widened back to f32, which an f32 GEMM
// then multiplies exactly and sums in f32, as the tensor cores do. TF32 is a mode of the GPU's tensor
// cores: here it multiplies in plain f32.
void matmul(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, double alpha, double beta,
            MatmulPrecision precision) {
  // Counted as tensor/cuda/gemm.cu's calls are: one cuBLAS call, or with nothing to sum one kernel.
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  if (K == 0) device_count::launch();
  else device_count::blas_call(2 * static_cast<uint64_t>(c.numel()) * static_cast<uint64_t>(K));
  if (precision != MatmulPrecision::BF16Inputs || c.dtype() != DType::F32)
    return cpu::matmul(a, trans_a, b, trans_b, c, alpha, beta, MatmulPrecision::F32);
  auto rounded = [](const Tensor& x) {
    return multiplied(bf16_operand(x));
  };
  cpu::matmul(rounded(a), trans_a, rounded(b), trans_b, c, alpha, beta, MatmulPrecision::F32);
}

// cuBLASLt's product with the addend in its epilogue: one call, the CPU GEMM that adds the addend to the
// finished sums; a product that is not one GEMM (or has nothing to sum) goes apart, as on a GPU.
bool matmul_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& addend, Tensor& c,
                MatmulPrecision precision) {
  const bool one_gemm = a.ndim() == 2 || (b.ndim() == 2 && !trans_a);
  const int64_t K = trans_a ? a.dim(-2) : a.dim(-1);
  if (!one_gemm || K == 0) return false;
  device_count::blas_call(2 * static_cast<uint64_t>(c.numel()) * static_cast<uint64_t>(K));
  const bool rounded = precision == MatmulPrecision::BF16Inputs && c.dtype() == DType::F32;
  auto operand = [rounded](const Tensor& x) { return rounded ? multiplied(bf16_operand(x)) : x; };
  cpu::matmul(operand(a), trans_a, operand(b), trans_b, c, 1.0, 0.0, MatmulPrecision::F32, addend);
  return true;
}

// The most work a grouped bf16 GEMM gives the tensor-core kernel itself (grouped_gemm_bf16.cu, run
// through the emulation as every kernel here): the emulated fragments repeat each product in every lane
// of a warp, which the GEMMs of the kernel tests take in milliseconds and a bench step's in minutes.
// Larger calls take the stand-in below, counted as that kernel counts (a GEMM call per part).
constexpr uint64_t kEmulatedTensorCoreFlops = uint64_t{1} << 24;

// cuBLAS's grouped call: one call, counted with all its problems' FLOPs, whose problems are the CPU's
// GEMMs (uncounted) on the matrices at the addresses that the pointer kernel wrote, so that those
// addresses are checked here as cuBLAS would use them. bf16 operands as on a GPU: the tensor-core kernel.
bool grouped_gemm(const GroupedGemm& g, MatmulPrecision) {
  const auto problems = static_cast<int64_t>(g.m.size());
  const bool bf16 = g.parts.front().a.dtype() == DType::BF16;
  if (bf16 && !grouped_gemm_bf16_takes(g)) return false;
  if (bf16 && g.flops() <= kEmulatedTensorCoreFlops) {
    grouped_gemm_bf16(g);
    return true;
  }
  if (bf16) {
    for (size_t p = 0; p < g.parts.size(); ++p) device_count::blas_call(g.part_flops(p));
  } else {
    device_count::blas_call(g.flops());
  }
  const int64_t* pointers = g.pointers.data<int64_t>();
  const int64_t stride = g.pointers.dim(1);
  for (int64_t j = 0; j < problems; ++j) {
    const GroupedGemm::Part& part = g.part_of(j);
    const Tensor a = rows_at(part.a, pointers[j], part.trans_a ? g.k[j] : g.m[j]);
    const Tensor b = rows_at(part.b, pointers[stride + j], part.trans_b ? g.n[j] : g.k[j]);
    Tensor c = rows_at(part.c, pointers[2 * stride + j], g.m[j]);
    LT_CHECK(c.dim(1) == g.n[j] && a.dim(1) == (part.trans_a ? g.m[j] : g.k[j]),
             "emulated grouped GEMM: problem ", j, " does not fit its operands");
    LT_CHECK(pointers[3 * stride + j] == g.m[j] && pointers[4 * stride + j] == g.n[j] &&
                 pointers[5 * stride + j] == g.k[j],
             "emulated grouped GEMM: the table's sizes of problem ", j, " are not the host's");
    cpu::matmul(multiplied(a), part.trans_a, multiplied(b), part.trans_b, c, 1.0, part.beta, MatmulPrecision::F32);
  }
  return true;
}

}  // namespace lt::cuda

#include "tensor/cuda/grouped_matmul.h"  // IWYU pragma: keep (the grouped GEMMs over the grouped_gemm above)
