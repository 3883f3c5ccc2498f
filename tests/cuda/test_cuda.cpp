// The CUDA backend. CudaBuild runs on every machine: the build flag, the device count against the
// runtime's own answer, clean errors. CudaMatchesCpu is the table of every op that has a CUDA kernel:
// each case draws its inputs from fixed seeds, runs the op once on CPU tensors and once on CUDA copies
// of them, and compares the outputs. CudaDevice covers copies, the allocator and the errors of the
// front doors. Cases that need a GPU skip where cudaGetDeviceCount fails or finds none.
//
// A new CUDA kernel gets one entry in cuda_cases() below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/kernels.h"
#include "tests/test_util.h"

// The CUDA runtime's own checks, where the real one is linked (not in lingtrain_emulated_gpu_tests,
// whose cuda:0 is tests/cuda/emulated_gpu.cpp).
#if defined(LINGTRAIN_CUDA) && !defined(LINGTRAIN_EMULATED_GPU_TESTS)
#define LINGTRAIN_REAL_CUDA_RUNTIME 1
#include "tensor/cuda/cuda_runtime.h"
#endif

namespace lt {
namespace {

using test::expect_close;
using test::random_tensor;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool have_gpu() { return cuda_device_count() > 0; }
constexpr const char* kNoGpu = "no usable CUDA device (cudaGetDeviceCount failed or found none)";

TEST(CudaBuild, CompiledFlagMatchesTheBuild) {
#ifdef LINGTRAIN_CUDA
  EXPECT_TRUE(cuda_compiled());
#else
  EXPECT_FALSE(cuda_compiled());
#endif
}

#ifdef LINGTRAIN_REAL_CUDA_RUNTIME
// The count is the runtime's when cudaGetDeviceCount succeeds and 0 when it reports an error (error 35
// without a driver), whatever it left in its output.
TEST(CudaBuild, DeviceCountIsZeroWhenTheRuntimeReportsAnError) {
  int runtime_count = -1;
  const cudaError_t status = cudaGetDeviceCount(&runtime_count);
  cudaGetLastError();  // a failed query sticks as the last error; later checks must not see it
  EXPECT_EQ(cuda_device_count(), status == cudaSuccess ? runtime_count : 0) << cudaGetErrorName(status);
}

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
#elif !defined(LINGTRAIN_CUDA)
TEST(CudaBuild, NoDeviceWithoutTheBackend) { EXPECT_EQ(cuda_device_count(), 0); }
#endif

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

// ---- the CUDA-vs-CPU table ---------------------------------------------------------------------------

// What one run of a case produced, each output named for the failure message.
using Outputs = std::vector<std::pair<std::string, Tensor>>;

struct OpCase {
  std::string op;       // the kernel under test
  std::string variant;  // dtype, shapes, flags: with op, the test's name
  double tolerance;     // relative, with the same absolute floor; 0: bit-identical bytes
  // Draws the inputs (fixed seeds, so both runs see the same values), puts them on `device`, runs the
  // op there and returns its outputs.
  std::function<Outputs(Device device)> run;
};

void PrintTo(const OpCase& c, std::ostream* out) { *out << c.op << " " << c.variant; }

// gtest names allow letters, digits and underscores only.
std::string case_name(const ::testing::TestParamInfo<OpCase>& info) {
  std::string name;
  for (const char ch : info.param.op + "_" + info.param.variant) {
    const bool keep = std::isalnum(static_cast<unsigned char>(ch));
    if (keep)
      name += ch;
    else if (!name.empty() && name.back() != '_')
      name += '_';
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return name;
}

Tensor input(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  return random_tensor(shape, seed, dtype).to(device);
}

using BinaryKernel = void (*)(const Tensor&, const Tensor&, Tensor&);

// b broadcast over a's leading dims (and equal shapes), out a new tensor and out == a (in place).
OpCase binary_case(std::string op, BinaryKernel kernel, DType dtype) {
  return {std::move(op), dtype_name(dtype), 0.0, [kernel, dtype](Device device) {
            Outputs outputs;
            for (const auto& [a_shape, b_shape] : std::vector<std::pair<Shape, Shape>>{
                     {{1}, {1}}, {{3, 17}, {17}}, {{129}, {129}}, {{5, 3, 129}, {3, 129}}, {{2, 1000}, {1000}}}) {
              const Tensor a = input(a_shape, 1, dtype, device), b = input(b_shape, 2, dtype, device);
              Tensor out = Tensor::empty(a_shape, dtype, device);
              kernel(a, b, out);
              Tensor in_place = a.clone();
              kernel(in_place, b, in_place);
              const std::string shapes = shape_str(a_shape) + " with " + shape_str(b_shape);
              outputs.push_back({shapes, out});
              outputs.push_back({shapes + " in place", in_place});
            }
            return outputs;
          }};
}

const std::vector<Shape> kVectorShapes{{1}, {1000}, {3, 4099}};

OpCase scale_case(DType dtype, double tolerance) {
  return {"scale", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : kVectorShapes) {
              // scale only writes its output: NaN already there must not leak into the result.
              Tensor out = Tensor::full(shape, kNaN, dtype, device);
              kernels::scale(input(shape, 5, dtype, device), 0.37, out);
              outputs.push_back({shape_str(shape), out});
            }
            return outputs;
          }};
}

OpCase axpy_case(DType dtype, double tolerance) {
  return {"axpy", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : kVectorShapes) {
              Tensor y = input(shape, 6, dtype, device);
              kernels::axpy(-1.5, input(shape, 5, dtype, device), y);
              outputs.push_back({shape_str(shape), y});
            }
            return outputs;
          }};
}

// SiLU and SwiGLU, forward and backward, over inputs wide enough (x 6) to saturate the sigmoid.
OpCase activation_case(DType dtype, double tolerance) {
  return {"silu swiglu", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : kVectorShapes) {
              const Tensor x = input(shape, 10, dtype, device), up = input(shape, 11, dtype, device);
              const Tensor dy = input(shape, 12, dtype, device);
              Tensor gate = Tensor::empty(shape, dtype, device);
              kernels::scale(x, 6.0, gate);
              Tensor y = Tensor::empty(shape, dtype, device), dx = Tensor::empty(shape, dtype, device);
              Tensor glu = Tensor::empty(shape, dtype, device);
              kernels::silu(gate, y);
              kernels::silu_backward(gate, dy, dx);
              const Tensor gate_up = test::side_by_side(gate, up);
              Tensor dgate_up = Tensor::empty(gate_up.shape(), dtype, device);
              kernels::swiglu(gate_up, glu);
              kernels::swiglu_backward(gate_up, dy, dgate_up);
              for (const auto& [what, out] : std::vector<std::pair<std::string, Tensor>>{
                       {"silu", y}, {"silu dx", dx}, {"swiglu", glu}, {"swiglu dgate_up", dgate_up}})
                outputs.push_back({what + " " + shape_str(shape), out});
            }
            return outputs;
          }};
}

// RMSNorm forward and backward over rows shorter and longer than a block (256), dw accumulated into, dx
// written and added to.
OpCase rmsnorm_case(DType dtype, double tolerance) {
  return {"rmsnorm", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : std::vector<Shape>{{1, 1}, {3, 7}, {2, 5, 300}, {17, 1000}}) {
              const int64_t C = shape.back();
              const Shape lead(shape.begin(), shape.end() - 1);
              const Tensor x = input(shape, 13, dtype, device), w = input({C}, 14, dtype, device);
              const Tensor dy = input(shape, 15, dtype, device);
              Tensor y = Tensor::empty(shape, dtype, device), rstd = Tensor::empty(lead, dtype, device);
              Tensor dx = Tensor::empty(shape, dtype, device), dw = input({C}, 16, dtype, device);
              kernels::rmsnorm(x, w, 1e-6, y, rstd);
              kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw);
              Tensor dx_added = input(shape, 17, dtype, device), dw_again = Tensor::zeros({C}, dtype, device);
              kernels::rmsnorm_backward(x, w, rstd, dy, dx_added, dw_again, 1.0);
              for (const auto& [what, out] : std::vector<std::pair<std::string, Tensor>>{
                       {"y", y}, {"rstd", rstd}, {"dx", dx}, {"dw", dw}, {"dx added to", dx_added}})
                outputs.push_back({what + " " + shape_str(shape), out});
            }
            return outputs;
          }};
}

// The residual add fused into RMSNorm's forward, rows shorter and longer than a block.
OpCase add_rmsnorm_case(DType dtype, double tolerance) {
  return {"add_rmsnorm", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : std::vector<Shape>{{1, 1}, {3, 7}, {2, 5, 300}, {17, 1000}}) {
              const int64_t C = shape.back();
              const Tensor a = input(shape, 18, dtype, device), b = input(shape, 19, dtype, device);
              const Tensor w = input({C}, 20, dtype, device);
              Tensor sum = Tensor::empty(shape, dtype, device), y = Tensor::empty(shape, dtype, device);
              Tensor rstd = Tensor::empty(Shape(shape.begin(), shape.end() - 1), dtype, device);
              kernels::add_rmsnorm(a, b, w, 1e-6, sum, y, rstd);
              for (const auto& [what, out] :
                   std::vector<std::pair<std::string, Tensor>>{{"sum", sum}, {"y", y}, {"rstd", rstd}})
                outputs.push_back({what + " " + shape_str(shape), out});
            }
            return outputs;
          }};
}

// Softmax and log-softmax forward and backward, rows shorter and longer than a block, with large logits.
OpCase softmax_case(DType dtype, double tolerance) {
  return {"softmax", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : std::vector<Shape>{{1, 1}, {3, 7}, {2, 5, 300}, {4, 3000}}) {
              Tensor x = Tensor::empty(shape, dtype, device);
              kernels::scale(input(shape, 17, dtype, device), 30.0, x);  // spread far beyond exp's f32 range
              const Tensor dy = input(shape, 18, dtype, device);
              Tensor p = Tensor::empty(shape, dtype, device), logp = Tensor::empty(shape, dtype, device);
              Tensor dx = Tensor::empty(shape, dtype, device), dlogx = Tensor::empty(shape, dtype, device);
              kernels::softmax(x, p);
              kernels::log_softmax(x, logp);
              kernels::softmax_backward(p, dy, dx);
              kernels::log_softmax_backward(logp, dy, dlogx);
              for (const auto& [what, out] : std::vector<std::pair<std::string, Tensor>>{
                       {"softmax", p}, {"log_softmax", logp}, {"softmax dx", dx}, {"log_softmax dx", dlogx}})
                outputs.push_back({what + " " + shape_str(shape), out});
            }
            return outputs;
          }};
}

// Two AdamW steps over a flat buffer (the second reads the moments the first wrote), gradients scaled.
OpCase adamw_case(DType dtype, double tolerance) {
  return {"adamw", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : kVectorShapes) {
              Tensor p = input(shape, 19, dtype, device), m = Tensor::zeros(shape, dtype, device);
              Tensor v = Tensor::zeros(shape, dtype, device);
              for (int64_t t = 1; t <= 2; ++t)
                kernels::adamw_step(p, input(shape, 20 + static_cast<uint64_t>(t), dtype, device), m, v,
                                    {1e-3, 0.9, 0.95, 1e-8, 0.1, t, 0.5});
              for (const auto& [what, out] : std::vector<std::pair<std::string, Tensor>>{{"p", p}, {"m", m}, {"v", v}})
                outputs.push_back({what + " " + shape_str(shape), out});
            }
            return outputs;
          }};
}

// Integer ids drawn on the host (the same on both runs), put on `device`.
Tensor ids_on(const Shape& shape, const std::function<int64_t(int64_t)>& id_of, DType dtype, Device device) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = id_of(i);
  return Tensor::from_vector(shape, ids).to(dtype).to(device);
}

// Sums of all elements (past one block and past the first pass's 1024 blocks), of squares, over the
// last dim, over leading dims (sum_to), and the factor read on the device (scale_by, axpy_by).
OpCase reduction_case(DType dtype, double tolerance) {
  return {"sums", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const Shape& shape : std::vector<Shape>{{1}, {3, 7}, {2, 5, 300}, {3, 100003}}) {
              const Tensor x = input(shape, 30, dtype, device);
              const Shape lead(shape.begin(), shape.end() - 1);
              Tensor total = Tensor::empty({1}, dtype, device), squares = Tensor::empty({1}, dtype, device);
              Tensor rows = Tensor::empty(lead, dtype, device), columns = Tensor::empty({shape.back()}, dtype, device);
              Tensor x_squared = Tensor::empty(shape, dtype, device);
              kernels::mul(x, x, x_squared);  // positive terms: a relative tolerance fits their sum
              kernels::sum(x_squared, total);
              kernels::sum_squares(x, squares);
              kernels::sum_last_dim(x, rows);
              kernels::sum_to(x, columns);
              const Tensor s = Tensor::full({1}, -0.3, dtype, device);
              Tensor scaled = Tensor::full(shape, kNaN, dtype, device), y = input(shape, 31, dtype, device);
              kernels::scale_by(x, s, 1.7, scaled);
              kernels::axpy_by(s, 2.5, x, y);
              for (const auto& [what, out] : Outputs{{"sum x^2", total},
                                                     {"sum_squares", squares},
                                                     {"sum_last_dim", rows},
                                                     {"sum_to", columns},
                                                     {"scale_by", scaled},
                                                     {"axpy_by", y}})
                outputs.push_back({what + " " + shape_str(shape), out});
            }
            return outputs;
          }};
}

// Cross-entropy with ignored rows (i32 and i64 targets), its backward, the count of targets and the
// mean over them with its backward.
OpCase cross_entropy_case(DType dtype, DType id_dtype, double tolerance) {
  return {"cross_entropy", std::string(dtype_name(dtype)) + " " + dtype_name(id_dtype), tolerance,
          [dtype, id_dtype](Device device) {
            Outputs outputs;
            for (const auto& [N, V] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 7}, {9, 300}, {3, 3000}}) {
              Tensor logits = Tensor::empty({N, V}, dtype, device);
              kernels::scale(input({N, V}, 32, dtype, device), 20.0, logits);
              const int64_t vocab = V;
              const Tensor targets = ids_on(
                  {N}, [vocab](int64_t n) { return n % 3 == 1 ? -100 : (n * 7919) % vocab; }, id_dtype, device);
              Tensor loss = Tensor::empty({N}, dtype, device), lse = Tensor::empty({N}, dtype, device);
              kernels::cross_entropy(logits, targets, -100, loss, lse);
              Tensor dlogits = Tensor::full({N, V}, kNaN, dtype, device);
              kernels::cross_entropy_backward(logits, targets, -100, lse, input({N}, 33, dtype, device), dlogits);
              Tensor count = Tensor::empty({1}, DType::I64, device), mean = Tensor::empty({1}, dtype, device);
              kernels::count_targets(targets, -100, count);
              kernels::mean_over_count(loss, count, mean);
              Tensor dvalues = Tensor::empty({N}, dtype, device);
              kernels::mean_over_count_backward(Tensor::full({1}, 0.7, dtype, device), count, dvalues);
              for (const auto& [what, out] :
                   Outputs{{"loss", loss}, {"lse", lse}, {"dlogits", dlogits}, {"mean", mean}, {"dmean", dvalues}})
                outputs.push_back({what + " [" + std::to_string(N) + ", " + std::to_string(V) + "]", out});
              // The count is an integer: compared as a float, it must be exact.
              outputs.push_back({"count", count.to(Device::cpu()).to(DType::F64).to(device)});
            }
            return outputs;
          }};
}

// Row and column gathers and scatter-adds with repeated ids, and top-k with ties and a NaN: the CPU's
// order of additions and selection rule, so bit for bit.
OpCase index_case(DType dtype, DType id_dtype) {
  return {"gather scatter topk", std::string(dtype_name(dtype)) + " " + dtype_name(id_dtype), 0.0,
          [dtype, id_dtype](Device device) {
            Outputs outputs;
            for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{3, 1}, {11, 7}, {40, 300}}) {
              const std::string where = " [" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
              const int64_t n = 2 * rows + 1, r = rows, c = cols, k = std::min<int64_t>(cols, 3) + 1;
              const Tensor idx = ids_on(
                  {n}, [r](int64_t i) { return (i * 5 + 2) % r; }, id_dtype, device);
              const Tensor table = input({rows, cols}, 34, dtype, device);
              Tensor gathered = Tensor::empty({n, cols}, dtype, device), acc = input({rows, cols}, 35, dtype, device);
              kernels::gather_rows(table, idx, gathered);
              kernels::scatter_add_rows(input({n, cols}, 36, dtype, device), idx, acc);
              const Tensor cidx = ids_on(
                  {rows, k}, [c, k](int64_t i) { return i % k == k - 1 ? 0 : (i * 3) % c; }, id_dtype, device);
              Tensor picked = Tensor::empty({rows, k}, dtype, device), dx = input({rows, cols}, 37, dtype, device);
              kernels::gather_cols(table, cidx, picked);
              kernels::scatter_add_cols(input({rows, k}, 38, dtype, device), cidx, dx);
              std::vector<double> v = random_tensor({rows, cols}, 39, DType::F64).to_vector<double>();
              for (size_t i = 0; i < v.size(); i += 7) v[i] = 0.25;  // ties
              const Tensor x = Tensor::from_vector({rows, cols}, v).to(dtype).to(device);
              Tensor best = Tensor::empty({rows, k - 1}, dtype, device);
              Tensor best_ids = Tensor::empty({rows, k - 1}, DType::I32, device);
              kernels::topk(x, k - 1, best, best_ids);
              // A NaN ranks first; only the ids are kept (the table's outputs are finite numbers).
              if (v.size() > 3) v[3] = kNaN;
              Tensor nan_best = Tensor::empty({rows, k - 1}, dtype, device);
              Tensor nan_ids = Tensor::empty({rows, k - 1}, DType::I32, device);
              kernels::topk(Tensor::from_vector({rows, cols}, v).to(dtype).to(device), k - 1, nan_best, nan_ids);
              for (const auto& [what, out] : Outputs{{"gather_rows", gathered},
                                                     {"scatter_add_rows", acc},
                                                     {"gather_cols", picked},
                                                     {"scatter_add_cols", dx},
                                                     {"topk values", best},
                                                     {"topk ids", best_ids},
                                                     {"topk ids with a NaN", nan_ids}})
                outputs.push_back({what + where, out});
            }
            return outputs;
          }};
}

// The column sums past one chunk of 64 rows and one tile of 128 columns (partial last ones), and the
// scatter-add of rows past one sort chunk of 256 source rows, with a row named by every third source row
// and rows named by none: the CPU's order of additions, so bit for bit.
OpCase column_sums_case(DType dtype, DType id_dtype) {
  return {"column sums sorted scatter_add_rows", std::string(dtype_name(dtype)) + " " + dtype_name(id_dtype), 0.0,
          [dtype, id_dtype](Device device) {
            const Tensor x = input({330, 293}, 42, dtype, device);
            Tensor sums = Tensor::full({293}, kNaN, dtype, device), inv_norm = Tensor::full({293}, kNaN, dtype, device);
            kernels::sum_to(x, sums);
            kernels::column_inv_norm(x, 1e-6, inv_norm);
            const Tensor idx = ids_on(
                {600}, [](int64_t i) { return i % 3 == 0 ? 7 : (i * 13 + i / 5) % 41; }, id_dtype, device);
            Tensor acc = input({50, 293}, 43, dtype, device);
            kernels::scatter_add_rows(input({600, 293}, 44, dtype, device), idx, acc);
            return Outputs{{"sum_to", sums}, {"column_inv_norm", inv_norm}, {"scatter_add_rows", acc}};
          }};
}

// Column slices in and out of a matrix, and NormHead's inverse column norms: bit for bit.
OpCase slice_case(DType dtype) {
  return {"copy_cols add_to_cols column_inv_norm", dtype_name(dtype), 0.0, [dtype](Device device) {
            Outputs outputs;
            for (const auto& [rows, C, start, W] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
                     {1, 1, 0, 1}, {5, 9, 2, 4}, {300, 33, 0, 33}, {2, 700, 300, 400}}) {
              const Tensor wide = input({rows, C}, 40, dtype, device);
              Tensor narrow = Tensor::full({rows, W}, kNaN, dtype, device), sum = wide.clone();
              kernels::copy_cols(wide, start, narrow);
              kernels::add_to_cols(input({rows, W}, 41, dtype, device), start, sum);
              Tensor inv_norm = Tensor::empty({C}, dtype, device);
              kernels::column_inv_norm(wide, 1e-6, inv_norm);
              const std::string where = " [" + std::to_string(rows) + ", " + std::to_string(C) + "] at " +
                                        std::to_string(start) + " + " + std::to_string(W);
              for (const auto& [what, out] :
                   Outputs{{"copy_cols", narrow}, {"add_to_cols", sum}, {"column_inv_norm", inv_norm}})
                outputs.push_back({what + where, out});
            }
            return outputs;
          }};
}

// RoPE both ways (in place too) at a large position offset, the fused QKV split with its backward, and
// the split into a KV cache.
OpCase rope_case(DType dtype, double tolerance) {
  return {
      "rope split_qkv_rope split_qkv_rope_to_cache", dtype_name(dtype), tolerance, [dtype](Device device) {
        Outputs outputs;
        for (const auto& [B, T, Hq, Hkv, D] : std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
                 {1, 1, 1, 1, 2}, {2, 5, 4, 2, 6}, {2, 129, 8, 2, 64}}) {
          const std::string where = " B" + std::to_string(B) + " T" + std::to_string(T) + " Hq" + std::to_string(Hq) +
                                    " Hkv" + std::to_string(Hkv) + " D" + std::to_string(D);
          const Tensor x = input({B, T, Hq, D}, 42, dtype, device);
          Tensor y = Tensor::empty({B, T, Hq, D}, dtype, device), back = y.clone();
          kernels::rope(x, 600000.0, 4093, false, y);
          kernels::rope(y, 600000.0, 4093, true, back);
          const int64_t C = (Hq + 2 * Hkv) * D;
          const Tensor qkv = input({B, T, C}, 43, dtype, device);
          Tensor q = Tensor::empty({B, T, Hq, D}, dtype, device), k = Tensor::empty({B, T, Hkv, D}, dtype, device);
          Tensor v = Tensor::empty({B, T, Hkv, D}, dtype, device), dqkv = Tensor::full({B, T, C}, kNaN, dtype, device);
          kernels::split_qkv_rope(qkv, 10000.0, 7, q, k, v);
          kernels::split_qkv_rope_backward(q, k, v, 10000.0, 7, dqkv);
          // Into a cache of 2 T + 3 positions per row: row 0 from position 0, row 1 from T + 3.
          std::vector<int64_t> Tk_B;
          for (int64_t b = 0; b < B; ++b) Tk_B.push_back(b == 0 ? 0 : T + 3);
          Tensor q_cached = Tensor::empty({B, T, Hq, D}, dtype, device);
          Tensor k_cache = input({B, 2 * T + 3, Hkv, D}, 44, dtype, device), v_cache = k_cache.clone();
          kernels::split_qkv_rope_to_cache(qkv, 10000.0, Tk_B, q_cached, k_cache, v_cache);
          for (const auto& [what, out] : Outputs{{"rope", y},
                                                 {"rope^-1", back},
                                                 {"q", q},
                                                 {"k", k},
                                                 {"v", v},
                                                 {"dqkv", dqkv},
                                                 {"q to cache", q_cached},
                                                 {"k cache", k_cache},
                                                 {"v cache", v_cache}})
            outputs.push_back({what + where, out});
        }
        return outputs;
      }};
}

// Attention forward and backward: partial tiles, GQA, the largest head dim, packed documents; also
// straight from a fused QKV projection.
OpCase attention_case(DType dtype, double tolerance) {
  return {
      "attention", dtype_name(dtype), tolerance, [dtype](Device device) {
        Outputs outputs;
        struct Dims {
          int64_t B, T, Hq, Hkv, D;
          bool packed;
        };
        for (const Dims& n : std::vector<Dims>{{1, 1, 1, 1, 4, false},
                                               {2, 37, 4, 2, 24, false},
                                               {1, 300, 8, 2, 128, false},
                                               {2, 45, 2, 1, 16, true}}) {
          const std::string where = " B" + std::to_string(n.B) + " T" + std::to_string(n.T) + " Hq" +
                                    std::to_string(n.Hq) + " Hkv" + std::to_string(n.Hkv) + " D" + std::to_string(n.D) +
                                    (n.packed ? " packed" : "");
          // Documents of 11 tokens packed into each row: boundaries inside and at the edges of tiles.
          const int64_t T = n.T;
          const Tensor doc_start =
              n.packed ? ids_on(
                             {n.B, n.T}, [T](int64_t i) { return (i % T) / 11 * 11; }, DType::I32, device)
                       : Tensor();
          const Tensor q = input({n.B, n.T, n.Hq, n.D}, 44, dtype, device);
          const Tensor k = input({n.B, n.T, n.Hkv, n.D}, 45, dtype, device);
          const Tensor v = input({n.B, n.T, n.Hkv, n.D}, 46, dtype, device);
          const double scale = 1.0 / std::sqrt(static_cast<double>(n.D));
          Tensor out = Tensor::empty(q.shape(), dtype, device), lse = Tensor::empty({n.B, n.Hq, n.T}, dtype, device);
          kernels::attention(q, k, v, scale, out, lse, doc_start);
          Tensor dq = Tensor::empty(q.shape(), dtype, device), dk = Tensor::empty(k.shape(), dtype, device);
          Tensor dv = Tensor::empty(k.shape(), dtype, device);
          kernels::attention_backward(q, k, v, out, lse, input(q.shape(), 47, dtype, device), scale, dq, dk, dv,
                                      doc_start);
          for (const auto& [what, t] : Outputs{{"out", out}, {"lse", lse}, {"dq", dq}, {"dk", dk}, {"dv", dv}})
            outputs.push_back({what + where, t});
          // The same from a fused projection, q and k turned by RoPE (the CPU in one pass each way).
          const Tensor qkv = input({n.B, n.T, (n.Hq + 2 * n.Hkv) * n.D}, 48, dtype, device);
          Tensor qkv_out = Tensor::empty(q.shape(), dtype, device), qkv_lse = Tensor::empty_like(lse);
          kernels::qkv_attention(qkv, n.Hq, n.Hkv, 10000.0, 5, scale, qkv_out, qkv_lse, doc_start);
          Tensor dqkv = Tensor::full(qkv.shape(), kNaN, dtype, device);
          kernels::qkv_attention_backward(qkv, n.Hq, n.Hkv, 10000.0, 5, qkv_out, qkv_lse,
                                          input(q.shape(), 49, dtype, device), scale, dqkv, doc_start);
          for (const auto& [what, t] :
               Outputs{{"qkv_attention out", qkv_out}, {"qkv_attention lse", qkv_lse}, {"qkv_attention dqkv", dqkv}})
            outputs.push_back({what + where, t});
        }
        return outputs;
      }};
}

// The router, the combine and its backward, the dispatch, the routing statistics and the grouped GEMMs
// over the dispatch's segments (cuBLAS), for one skewed routing with empty experts.
OpCase moe_case(DType dtype, double tolerance) {
  return {"moe", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            for (const auto& [N, E, k] :
                 std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {9, 8, 2}, {700, 16, 3}}) {
              const std::string where = " N" + std::to_string(N) + " E" + std::to_string(E) + " k" + std::to_string(k);
              Tensor logits = Tensor::empty({N, E}, dtype, device);
              kernels::scale(input({N, E}, 50, dtype, device), 3.0, logits);
              Tensor probs = Tensor::empty({N, E}, dtype, device), lse = Tensor::empty({N}, dtype, device);
              Tensor weights = Tensor::empty({N, k}, dtype, device), ids = Tensor::empty({N, k}, DType::I32, device);
              kernels::router_topk(logits, k, true, probs, lse, weights, ids);
              Tensor dlogits = Tensor::empty({N, E}, dtype, device), daux = Tensor::empty({N, E}, dtype, device);
              kernels::router_topk_backward(probs, ids, true, input({N, k}, 51, dtype, device), 0.5, dlogits);
              auto f64 = [device] { return Tensor::empty({1}, DType::F64, device); };
              Tensor counts = Tensor::empty({E}, dtype, device), balance = f64(), z = f64();
              Tensor aux = Tensor::empty({1}, dtype, device), entropy = f64(), max_logit = f64();
              kernels::router_aux_loss(probs, lse, ids, 0.01, 0.001, counts, balance, z, aux);
              // The same two in one call.
              Tensor one_probs = Tensor::empty({N, E}, dtype, device), one_lse = Tensor::empty({N}, dtype, device);
              Tensor one_weights = Tensor::empty({N, k}, dtype, device), one_counts = Tensor::empty({E}, dtype, device);
              Tensor one_ids = Tensor::empty({N, k}, DType::I32, device);
              Tensor one_balance = f64(), one_z = f64(), one_aux = Tensor::empty({1}, dtype, device);
              kernels::router_topk_with_aux_loss(logits, k, true, 0.01, 0.001, one_probs, one_lse, one_weights, one_ids,
                                                 one_counts, one_balance, one_z, one_aux);
              kernels::router_aux_backward(probs, lse, counts, Tensor::full({1}, 0.3, dtype, device), 0.01, 0.001,
                                           daux);
              kernels::routing_entropy(probs, logits, lse, entropy, max_logit);
              Tensor token = Tensor::empty({N * k}, DType::I32, device);
              Tensor position = Tensor::empty({N * k}, DType::I32, device);
              Tensor offsets = Tensor::empty({E + 1}, DType::I64, device);
              kernels::dispatch_plan(ids, token, position, offsets);
              const int64_t C = 24, F = 40, M = N * k;
              const Tensor y = input({M, C}, 52, dtype, device);
              Tensor combined = Tensor::empty({N, C}, dtype, device);
              kernels::combine_rows(y, weights, position, combined);
              Tensor combined_added = input({N, C}, 60, dtype, device);
              kernels::combine_rows(y, weights, position, combined_added, 1.0);
              const Tensor gate_up = input({M, 2 * C}, 57, dtype, device), t = input({M, C}, 53, dtype, device);
              Tensor h = Tensor::empty({M, C}, dtype, device), dgate_up = Tensor::empty({M, 2 * C}, dtype, device);
              Tensor dw = Tensor::empty({N, k}, dtype, device);
              kernels::swiglu_combine_backward(weights, position, gate_up, t, h, dgate_up, dw);
              // The experts' up projection over the sorted rows, and its weight gradient; then the same
              // from the tokens' rows read through the dispatch (gathered first on the GPU).
              Tensor rows_out = Tensor::empty({M, F}, dtype, device), w_grad = Tensor::empty({E, F, C}, dtype, device);
              const Tensor w_up = input({E, F, C}, 55, dtype, device), x = input({N, C}, 59, dtype, device);
              kernels::grouped_matmul(y, w_up, true, offsets, rows_out);
              kernels::grouped_weight_grad(rows_out, y, offsets, w_grad, 0.0);
              // Two products read x through the same index (the GPU gathers it once for both).
              Tensor x_out = Tensor::empty({M, F}, dtype, device), x_grad = Tensor::empty({E, F, C}, dtype, device);
              Tensor x_out2 = Tensor::empty({M, F}, dtype, device), x_grad2 = Tensor::empty({E, F, C}, dtype, device);
              kernels::grouped_matmuls({{x, w_up, true, x_out, 0.0, token},
                                        {x, input({E, F, C}, 61, dtype, device), true, x_out2, 0.0, token}},
                                       offsets);
              kernels::grouped_weight_grads(
                  {{rows_out, x, x_grad, 0.0, {}, token}, {x_out2, x, x_grad2, 0.0, {}, token}}, offsets);
              Tensor stats = Tensor::zeros({3}, DType::F64, device), noise = Tensor::empty({N, E}, dtype, device);
              Tensor observations = Tensor::zeros({3}, DType::F64, device);
              kernels::routing_warmup_observe(logits, stats, observations);
              kernels::routing_warmup_fold(observations, 0.9, stats);
              kernels::routing_warmup_noise(stats, random_tensor({N, E}, 56, DType::F64).to(device), 0.25, noise);
              auto as_float = [device](const Tensor& t) { return t.to(Device::cpu()).to(DType::F64).to(device); };
              for (const auto& [what, out] : Outputs{{"probs", probs},
                                                     {"lse", lse},
                                                     {"weights", weights},
                                                     {"ids", as_float(ids)},
                                                     {"dlogits", dlogits},
                                                     {"counts", counts},
                                                     {"balance", balance},
                                                     {"z", z},
                                                     {"aux", aux},
                                                     {"daux", daux},
                                                     {"entropy", entropy},
                                                     {"max_logit", max_logit},
                                                     {"token_of", as_float(token)},
                                                     {"position_of", as_float(position)},
                                                     {"offsets", as_float(offsets)},
                                                     {"combined", combined},
                                                     {"combined added to out", combined_added},
                                                     {"dgate_up", dgate_up},
                                                     {"h", h},
                                                     {"dw", dw},
                                                     {"grouped_matmul", rows_out},
                                                     {"grouped_weight_grad", w_grad},
                                                     {"grouped_matmul through token_of", x_out},
                                                     {"grouped_weight_grad through token_of", x_grad},
                                                     {"second grouped_matmul through token_of", x_out2},
                                                     {"second grouped_weight_grad through token_of", x_grad2},
                                                     {"warmup stats", stats},
                                                     {"warmup noise", noise},
                                                     {"router_topk_with_aux_loss probs", one_probs},
                                                     {"router_topk_with_aux_loss lse", one_lse},
                                                     {"router_topk_with_aux_loss weights", one_weights},
                                                     {"router_topk_with_aux_loss ids", as_float(one_ids)},
                                                     {"router_topk_with_aux_loss counts", one_counts},
                                                     {"router_topk_with_aux_loss balance", one_balance},
                                                     {"router_topk_with_aux_loss z", one_z},
                                                     {"router_topk_with_aux_loss aux", one_aux}})
                outputs.push_back({what + where, out});
            }
            return outputs;
          }};
}

// Decoding attention against partly filled caches, and the DPO loss with its token gradients.
OpCase decode_and_dpo_case(DType dtype, double tolerance) {
  return {"attention_decode dpo_loss", dtype_name(dtype), tolerance, [dtype](Device device) {
            Outputs outputs;
            const Tensor q = input({2, 3, 4, 16}, 60, dtype, device);
            const Tensor k = input({2, 300, 2, 16}, 61, dtype, device), v = input({2, 300, 2, 16}, 62, dtype, device);
            Tensor out = Tensor::empty(q.shape(), dtype, device);
            kernels::attention_decode(q, k, v, {290, 37}, 0.25, out);  // rows of different lengths
            outputs.push_back({"attention_decode", out});
            const int64_t N = 40, P = 3;
            const Tensor response =
                ids_on({N}, [](int64_t n) { return n % 5 == 0 ? -1 : (n * 3) % (2 * P); }, DType::I32, device);
            const Tensor counted = ids_on({N}, [](int64_t n) { return n % 7 != 3 ? 1 : 0; }, DType::I32, device);
            const Tensor reference = Tensor::from_vector<double>({2 * P}, {-3.0, -3.5, -4.0, -2.0, -6.0, -5.5}, device);
            Tensor loss = Tensor::empty({1}, dtype, device), dx = Tensor::empty({N}, dtype, device);
            Tensor stats = Tensor::empty({kernels::kDpoStats}, DType::F64, device);
            kernels::dpo_loss(input({N}, 63, dtype, device), response, counted, reference, 0.1, 0.05, loss, stats, dx);
            for (const auto& [what, t] : Outputs{{"dpo loss", loss}, {"dpo stats", stats}, {"dpo dtoken_logp", dx}})
              outputs.push_back({what, t});
            return outputs;
          }};
}

// Tensor::fill_ (and so zeros and full) in every dtype, over a tensor that held something else.
OpCase fill_case(DType dtype) {
  return {"fill", dtype_name(dtype), 0.0, [dtype](Device device) {
            Outputs outputs;
            for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{257}, int64_t{100003}}) {
              for (const double value : {2.5, -3.0, 1e-3, 0.0, -0.0, 7e5}) {
                Tensor t = Tensor::full({n}, 99.0, dtype, device);
                t.fill_(value);
                outputs.push_back({"n=" + std::to_string(n) + " value=" + std::to_string(value), t});
              }
            }
            return outputs;
          }};
}

struct GemmShape {
  std::string name;
  int64_t G, M, N, K;  // G == 0: 2-D a
  bool b_batched;
};

// c = alpha op(a) op(b) + beta c for (alpha, beta) = (1, 0), where c starts as NaN that must not be read,
// and (1.5, 0.5); and matmul_add into NaN.
OpCase matmul_case(const GemmShape& s, bool trans_a, bool trans_b, DType dtype, double tolerance) {
  std::string variant = std::string(dtype_name(dtype)) + " " + s.name;
  if (trans_a) variant += " trans_a";
  if (trans_b) variant += " trans_b";
  return {"matmul", variant, tolerance, [s, trans_a, trans_b, dtype](Device device) {
            Shape a_shape = trans_a ? Shape{s.K, s.M} : Shape{s.M, s.K};
            Shape b_shape = trans_b ? Shape{s.N, s.K} : Shape{s.K, s.N};
            Shape c_shape{s.M, s.N};
            if (s.G > 0) {
              a_shape.insert(a_shape.begin(), s.G);
              c_shape.insert(c_shape.begin(), s.G);
              if (s.b_batched) b_shape.insert(b_shape.begin(), s.G);
            }
            const Tensor a = input(a_shape, 7, dtype, device), b = input(b_shape, 8, dtype, device);
            Outputs outputs;
            for (const auto& [alpha, beta] : std::vector<std::pair<double, double>>{{1.0, 0.0}, {1.5, 0.5}}) {
              Tensor c = beta == 0.0 ? Tensor::full(c_shape, kNaN, dtype, device) : input(c_shape, 9, dtype, device);
              kernels::matmul(a, trans_a, b, trans_b, c, alpha, beta);
              outputs.push_back({"beta=" + std::to_string(beta), c});
            }
            Tensor c = Tensor::full(c_shape, kNaN, dtype, device);
            kernels::matmul_add(a, trans_a, b, trans_b, input(c_shape, 10, dtype, device), c);
            outputs.push_back({"matmul_add", c});
            return outputs;
          }};
}

// Mixed precision: the GPU's bf16-operand GEMM against the CPU's f32 GEMM of the same operands rounded
// to bf16 (exact products, so only the order of the f32 sums differs). On the CPU run the precision is
// ignored, so the case rounds the operands itself there.
OpCase bf16_matmul_case(const GemmShape& s, bool trans_a, bool trans_b) {
  std::string variant = s.name + (trans_a ? " trans_a" : "") + (trans_b ? " trans_b" : "");
  return {"matmul bf16 inputs", variant, 1e-5, [s, trans_a, trans_b](Device device) {
            Shape a_shape = trans_a ? Shape{s.K, s.M} : Shape{s.M, s.K};
            Shape b_shape = trans_b ? Shape{s.N, s.K} : Shape{s.K, s.N};
            Shape c_shape{s.M, s.N};
            if (s.G > 0) {
              a_shape.insert(a_shape.begin(), s.G);
              c_shape.insert(c_shape.begin(), s.G);
              if (s.b_batched) b_shape.insert(b_shape.begin(), s.G);
            }
            Tensor a = random_tensor(a_shape, 71), b = random_tensor(b_shape, 72);
            if (device.is_cpu()) {
              a = a.to(DType::BF16).to(DType::F32);
              b = b.to(DType::BF16).to(DType::F32);
            }
            Tensor c = random_tensor(c_shape, 73).to(device);
            kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
            kernels::matmul(a.to(device), trans_a, b.to(device), trans_b, c, 0.5, 1.0);
            kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
            return Outputs{{"c", c}};
          }};
}

// Attention under mixed precision: on the GPU the tensor-core kernels (q, k, v and dout as bf16, P and
// dS rounded to bf16 for the second products, f32 sums and statistics), on the CPU the exact f32 kernel
// on the operands rounded to bf16 (in f32 mode: the CPU run rounds them itself, after the split and RoPE
// of the fused projection, where the GPU rounds them; the CPU's own bf16 products are checked against
// this reference in tests/tensor/test_rope_attention.cpp). What remains is
// the rounding of P and dS, relative 2^-9, which moves out by at most 2^-9 max|v| and a gradient by a
// few 2^-9 |x| (tests/cuda/test_cuda_emulation.cpp derives it): 1e-2.
OpCase bf16_attention_case() {
  return {"attention bf16 inputs", "f32", 1e-2, [](Device device) {
            Outputs outputs;
            const bool rounded = device.is_cpu();
            auto operand = [rounded](const Tensor& x) { return rounded ? x.to(DType::BF16).to(DType::F32) : x; };
            struct Dims {
              int64_t B, T, Hq, Hkv, D;
              bool packed;
            };
            for (const Dims& n : std::vector<Dims>{{1, 100, 4, 2, 128, false}, {2, 45, 2, 1, 64, true}}) {
              const std::string where = " B" + std::to_string(n.B) + " T" + std::to_string(n.T) + " D" +
                                        std::to_string(n.D) + (n.packed ? " packed" : "");
              const int64_t T = n.T;
              const Tensor doc_start =
                  n.packed ? ids_on(
                                 {n.B, n.T}, [T](int64_t i) { return (i % T) / 11 * 11; }, DType::I32, device)
                           : Tensor();
              const double scale = 1.0 / std::sqrt(static_cast<double>(n.D));
              const Tensor qkv = input({n.B, n.T, (n.Hq + 2 * n.Hkv) * n.D}, 58, DType::F32, device);
              const Tensor dout = input({n.B, n.T, n.Hq, n.D}, 59, DType::F32, device);
              Tensor q = Tensor::empty({n.B, n.T, n.Hq, n.D}, DType::F32, device);
              Tensor k = Tensor::empty({n.B, n.T, n.Hkv, n.D}, DType::F32, device), v = Tensor::empty_like(k);
              kernels::split_qkv_rope(qkv, 10000.0, 5, q, k, v);
              Tensor out = Tensor::empty_like(q), lse = Tensor::empty({n.B, n.Hq, n.T}, DType::F32, device);
              Tensor dq = Tensor::empty_like(q), dk = Tensor::empty_like(k), dv = Tensor::empty_like(k);
              Tensor dqkv = Tensor::full(qkv.shape(), kNaN, DType::F32, device);
              if (rounded) {  // the split, then the f32 kernel on rounded operands
                kernels::attention(operand(q), operand(k), operand(v), scale, out, lse, doc_start);
                kernels::attention_backward(operand(q), operand(k), operand(v), out, lse, operand(dout), scale, dq,
                                            dk, dv, doc_start);
                kernels::split_qkv_rope_backward(dq, dk, dv, 10000.0, 5, dqkv);
              } else {
                kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
                kernels::attention(q, k, v, scale, out, lse, doc_start);
                kernels::attention_backward(q, k, v, out, lse, dout, scale, dq, dk, dv, doc_start);
                Tensor qkv_out = Tensor::empty_like(q), qkv_lse = Tensor::empty_like(lse);
                kernels::qkv_attention(qkv, n.Hq, n.Hkv, 10000.0, 5, scale, qkv_out, qkv_lse, doc_start);
                kernels::qkv_attention_backward(qkv, n.Hq, n.Hkv, 10000.0, 5, qkv_out, qkv_lse, dout, scale, dqkv,
                                                doc_start);
              }
              kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
              for (const auto& [what, t] : Outputs{{"out", out}, {"lse", lse}, {"dq", dq}, {"dk", dk}, {"dv", dv},
                                                   {"qkv_attention dqkv", dqkv}})
                outputs.push_back({what + where, t});
            }
            return outputs;
          }};
}

// The grouped GEMMs, one grouped call each on the GPU, on segments of every kind: empty experts first,
// last and between (a written weight gradient's are zeroed over NaN), one row, uneven lengths; written
// and added, two products in one call (transposed and not), a product and a weight gradient reading
// their rows through an index (gathered first on the GPU, into bf16 under bf16 inputs), through the
// offsets' host copy as a DispatchPlan passes it. Under bf16 inputs the CPU run
// rounds the operands itself (bf16_matmul_case); K = 16 keeps every bf16 row 16-byte aligned (one
// grouped call), K = 13 does not (expert by expert). TF32 is plain f32 off the GPU: on one, its
// tolerance is TF32's (10 mantissa bits).
OpCase grouped_case(DType dtype, kernels::MatmulPrecision precision, int64_t K, double tolerance) {
  const std::string variant =
      std::string(dtype_name(dtype)) +
      (precision == kernels::MatmulPrecision::F32 ? "" : std::string(" ") + kernels::matmul_precision_name(precision)) +
      " K" + std::to_string(K);
  return {"grouped matmul", variant, tolerance, [dtype, precision, K](Device device) {
            const std::vector<int64_t> bounds{0, 0, 3, 3, 4, 17, 17, 30, 30};
            const int64_t E = static_cast<int64_t>(bounds.size()) - 1, M = bounds.back(), N = 24;
            const bool rounded = precision == kernels::MatmulPrecision::BF16Inputs && device.is_cpu();
            auto operand = [&](const Shape& shape, uint64_t seed) {
              const Tensor x = random_tensor(shape, seed, dtype);
              return (rounded ? x.to(DType::BF16).to(dtype) : x).to(device);
            };
            const Tensor a = operand({M, K}, 81), w = operand({E, N, K}, 82), w_plain = operand({E, K, N}, 83);
            const Tensor g = operand({M, N}, 84);
            const Tensor host_offsets = Tensor::from_vector<int64_t>({E + 1}, bounds);
            const Tensor offsets = host_offsets.to(device);
            Tensor out = Tensor::full({M, N}, kNaN, dtype, device), out_added = input({M, N}, 85, dtype, device);
            Tensor out_plain = Tensor::full({M, N}, kNaN, dtype, device);
            Tensor dw = Tensor::full({E, K, N}, kNaN, dtype, device), dw_added = input({E, K, N}, 86, dtype, device);
            const Tensor table = operand({M + 5, K}, 87);
            std::vector<int32_t> row_ids(static_cast<size_t>(M));
            for (int64_t i = 0; i < M; ++i) row_ids[static_cast<size_t>(i)] = static_cast<int32_t>(i * 7 % (M + 5));
            const Tensor rows = Tensor::from_vector<int32_t>({M}, row_ids).to(device);
            Tensor out_gathered = Tensor::full({M, N}, kNaN, dtype, device);
            Tensor dw_gathered = Tensor::full({E, N, K}, kNaN, dtype, device);
            kernels::set_matmul_precision(precision);
            kernels::grouped_matmuls(
                {{a, w, true, out, 0.0}, {a, w_plain, false, out_plain, 0.0}, {a, w, true, out_added, 1.0}}, offsets,
                host_offsets);
            kernels::grouped_matmuls({{table, w, true, out_gathered, 0.0, rows}}, offsets, host_offsets);
            kernels::grouped_weight_grads({{a, g, dw, 0.0}, {a, g, dw_added, 1.0}}, offsets, host_offsets);
            kernels::grouped_weight_grads({{g, table, dw_gathered, 0.0, {}, rows}}, offsets, host_offsets);
            // On a GPU under bf16 inputs the operands may come as bf16 copies (autograd's kept copies, the
            // experts' gradients written in bf16), gathered or not, beside f32 ones: taken as they are.
            const bool copies = precision == kernels::MatmulPrecision::BF16Inputs && !device.is_cpu();
            auto as_written = [copies](const Tensor& x) { return copies ? x.to(DType::BF16) : x; };
            Tensor out_copy = Tensor::full({M, N}, kNaN, dtype, device);
            Tensor dw_copies = Tensor::full({E, K, N}, kNaN, dtype, device);
            Tensor dw_gathered_copy = Tensor::full({E, N, K}, kNaN, dtype, device);
            kernels::grouped_matmuls({{as_written(a), w, true, out_copy, 0.0}}, offsets, host_offsets);
            kernels::grouped_weight_grads({{as_written(a), as_written(g), dw_copies, 0.0}}, offsets, host_offsets);
            kernels::grouped_weight_grads({{g, as_written(table), dw_gathered_copy, 0.0, {}, rows}}, offsets,
                                          host_offsets);
            kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
            return Outputs{{"out", out},
                           {"out added", out_added},
                           {"out, w untransposed", out_plain},
                           {"out, a gathered", out_gathered},
                           {"dw", dw},
                           {"dw added", dw_added},
                           {"dw, b gathered", dw_gathered},
                           {"out, a a bf16 copy", out_copy},
                           {"dw, a and b bf16 copies", dw_copies},
                           {"dw, b a gathered bf16 copy", dw_gathered_copy}};
          }};
}

// f32 -> bf16 (rounded to nearest even) and back (exact); NaN and the other bit patterns are the
// emulation tests' (test_cuda_emulation.cpp).
OpCase convert_case() {
  return {"convert", "f32 bf16", 0.0, [](Device device) {
            Outputs outputs;
            for (const Shape& shape : kVectorShapes) {
              Tensor x16 = Tensor::empty(shape, DType::BF16, device), back = Tensor::empty(shape, DType::F32, device);
              kernels::convert(input(shape, 8, DType::F32, device), x16);
              kernels::convert(x16, back);
              outputs.push_back({shape_str(shape) + " bf16", x16});
              outputs.push_back({shape_str(shape) + " widened", back});
            }
            return outputs;
          }};
}

std::vector<OpCase> cuda_cases() {
  std::vector<OpCase> cases;
  for (const DType dtype : {DType::F32, DType::F64}) {
    const bool f32 = dtype == DType::F32;
    cases.push_back(binary_case("add", kernels::add, dtype));
    cases.push_back(binary_case("sub", kernels::sub, dtype));
    cases.push_back(binary_case("mul", kernels::mul, dtype));
    cases.push_back(scale_case(dtype, f32 ? 1e-6 : 1e-14));
    cases.push_back(axpy_case(dtype, f32 ? 1e-6 : 1e-14));
    cases.push_back(activation_case(dtype, f32 ? 1e-6 : 1e-14));
    cases.push_back(rmsnorm_case(dtype, f32 ? 1e-5 : 1e-13));
    cases.push_back(add_rmsnorm_case(dtype, f32 ? 1e-5 : 1e-13));
    cases.push_back(softmax_case(dtype, f32 ? 1e-5 : 1e-13));
    cases.push_back(adamw_case(dtype, f32 ? 1e-6 : 1e-14));
    cases.push_back(reduction_case(dtype, f32 ? 2e-5 : 1e-12));
    for (const DType id_dtype : {DType::I32, DType::I64}) {
      cases.push_back(cross_entropy_case(dtype, id_dtype, f32 ? 1e-5 : 1e-13));
      cases.push_back(index_case(dtype, id_dtype));
      cases.push_back(column_sums_case(dtype, id_dtype));
    }
    cases.push_back(slice_case(dtype));
    // The device's cos, sin and pow (f64: within 2 ulp, glibc's within 1) make the f64 tables differ in
    // the last bits: at angles up to 128 radians an ulp of the angle is 1.4e-14 (2e-13 measured on an H200).
    cases.push_back(rope_case(dtype, f32 ? 1e-6 : 1e-12));
    cases.push_back(attention_case(dtype, f32 ? 2e-5 : 1e-12));
    // The experts' weight gradient sums ~130 products of size ~5 (partial sums up to ~60) into results as
    // small as 0.01, in cuBLAS's order on a GPU: f32 differences of 1-2e-5 (measured on an H200).
    cases.push_back(moe_case(dtype, f32 ? 1e-4 : 1e-12));
    cases.push_back(decode_and_dpo_case(dtype, f32 ? 1e-6 : 1e-13));
    for (const GemmShape& shape : std::vector<GemmShape>{
             {"plain", 0, 13, 17, 19, false},
             {"one element", 0, 1, 1, 1, false},
             {"batched", 3, 5, 9, 7, true},
             {"batched shared b", 4, 6, 11, 8, false},  // tall GEMM, or stride 0 when a is transposed
             {"K=0", 0, 4, 6, 0, false}}) {             // c = beta * c
      for (const bool trans_a : {false, true})
        for (const bool trans_b : {false, true})
          cases.push_back(matmul_case(shape, trans_a, trans_b, dtype, f32 ? 1e-5 : 1e-12));
    }
  }
  for (const DType dtype : {DType::F32, DType::F64, DType::BF16, DType::I32, DType::I64})
    cases.push_back(fill_case(dtype));
  cases.push_back(convert_case());
  for (const GemmShape& shape : std::vector<GemmShape>{{"plain", 0, 13, 17, 19, false}, {"batched", 3, 5, 9, 70, true},
                                                       {"batched shared b", 4, 6, 11, 8, false}})
    for (const bool trans_a : {false, true})
      for (const bool trans_b : {false, true}) cases.push_back(bf16_matmul_case(shape, trans_a, trans_b));
  cases.push_back(bf16_attention_case());
  for (const int64_t K : {16, 13}) {
    cases.push_back(grouped_case(DType::F32, kernels::MatmulPrecision::F32, K, 1e-5));
    cases.push_back(grouped_case(DType::F64, kernels::MatmulPrecision::F32, K, 1e-12));
    cases.push_back(grouped_case(DType::F32, kernels::MatmulPrecision::BF16Inputs, K, 1e-5));
    cases.push_back(grouped_case(DType::F32, kernels::MatmulPrecision::TF32, K, 5e-3));
  }
  return cases;
}

// The bytes of a tensor, copied to the host.
std::vector<unsigned char> host_bytes(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  std::vector<unsigned char> bytes(host.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), host.raw_data(), bytes.size());
  return bytes;
}

std::vector<double> host_values(const Tensor& t) { return t.to(Device::cpu()).to(DType::F64).to_vector<double>(); }

class CudaMatchesCpu : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << kNoGpu;
  }
};

TEST_P(CudaMatchesCpu, OnTheSameInputs) {
  const OpCase& c = GetParam();
  const Outputs expected = c.run(Device::cpu());
  const Outputs actual = c.run(Device::cuda(0));
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    SCOPED_TRACE(expected[i].first);
    const Tensor& gpu_out = actual[i].second;
    ASSERT_EQ(gpu_out.device(), Device::cuda(0));
    ASSERT_EQ(gpu_out.shape(), expected[i].second.shape());
    if (c.tolerance == 0)
      EXPECT_EQ(host_bytes(gpu_out), host_bytes(expected[i].second));
    else
      expect_close(host_values(gpu_out), host_values(expected[i].second), c.tolerance, c.tolerance, c.op);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaMatchesCpu, ::testing::ValuesIn(cuda_cases()), case_name);

// The CPU half of every case, on every machine: a case that cannot even run there is found without a GPU.
TEST(CudaCases, EveryCaseRunsOnTheCpu) {
  std::vector<std::string> names;
  for (const OpCase& c : cuda_cases()) {
    SCOPED_TRACE(c.op + " " + c.variant);
    for (const auto& [what, out] : c.run(Device::cpu())) {
      EXPECT_TRUE(out.is_cpu()) << what;
      if (!is_floating(out.dtype())) continue;
      for (const double v : host_values(out)) ASSERT_TRUE(std::isfinite(v)) << what;
    }
    names.push_back(case_name({c, 0}));
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "two cases share a test name";
}

// ---- device tests beside the table ----------------------------------------------------------------------

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_gpu()) GTEST_SKIP() << kNoGpu;
  }
  static Device gpu() { return Device::cuda(0); }
};

TEST_F(CudaDevice, CopiesRoundTripBitForBit) {
  for (const DType dtype : {DType::F32, DType::F64, DType::BF16}) {
    for (const Shape& shape : {Shape{0}, Shape{1}, Shape{7, 33}, Shape{3, 1000}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + shape_str(shape));
      const Tensor host = random_tensor(shape, 11, DType::F32).to(dtype);
      const Tensor device = host.to(gpu());
      EXPECT_EQ(device.device(), gpu());
      EXPECT_EQ(host_bytes(device), host_bytes(host));          // host -> device -> host
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

TEST_F(CudaDevice, CopiesBetweenDevices) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Tensor host = random_tensor({5, 77}, 12);
  const Tensor on_first = host.to(gpu());
  const Tensor on_second = on_first.to(Device::cuda(1));
  EXPECT_EQ(on_second.device(), Device::cuda(1));
  EXPECT_EQ(host_bytes(on_second), host_bytes(host));
  EXPECT_EQ(host_bytes(on_second.to(gpu())), host_bytes(host));
}

TEST_F(CudaDevice, OperandsOnDifferentDevicesAreAnError) {
  // An error from the front door, not a read of device memory on the host.
  const Tensor a = random_tensor({4}, 3), b = random_tensor({4}, 4);
  Tensor out = Tensor::empty({4}, DType::F32, gpu());
  EXPECT_THROW(kernels::add(a.to(gpu()), b, out), Error);
}

// Ids are checked on the device before they address memory: one clear error naming the first bad id,
// and the output untouched.
TEST_F(CudaDevice, OutOfRangeIdsAreOneClearErrorFromTheDevice) {
  const Tensor table = random_tensor({10, 4}, 14).to(gpu());
  const Tensor ids = Tensor::from_vector<int64_t>({5}, {1, 2, 10, 3, -1}, gpu());
  Tensor out = Tensor::full({5, 4}, 7.0, DType::F32, gpu());
  try {
    kernels::gather_rows(table, ids, out);
    ADD_FAILURE() << "gather_rows read row 10 of a 10-row table";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "gather_rows: index 10 at position 2 is out of range [0, 10)");
  }
  EXPECT_EQ(host_values(out), std::vector<double>(20, 7.0));
  const Tensor logits = random_tensor({3, 10}, 15).to(gpu());
  const Tensor targets = Tensor::from_vector<int32_t>({3}, {-100, 4, 11}, gpu());
  Tensor loss = Tensor::empty({3}, DType::F32, gpu()), lse = Tensor::empty({3}, DType::F32, gpu());
  try {
    kernels::cross_entropy(logits, targets, -100, loss, lse);
    ADD_FAILURE() << "cross_entropy took target 11 of a 10-word vocabulary";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cross_entropy: target id 11 (row 2) is outside the vocabulary [0, 10)");
  }
}

// On the device too, add_rmsnorm has the bits of add then rmsnorm. Under mixed precision the forward kernels
// write the bf16 copies of what they normalise and of what they write with the bits of kernels::convert,
// and the backward reading the first as it is gives the bits of the backward reading it widened (dx
// written and added to, dw).
TEST_F(CudaDevice, RmsNormWritesAndReadsTheKeptBf16CopyWithTheBitsOfConverting) {
  for (const Shape& shape : {Shape{3, 7}, Shape{2, 5, 300}, Shape{130, 64}}) {
    SCOPED_TRACE(shape_str(shape));
    const int64_t C = shape.back();
    const Shape lead(shape.begin(), shape.end() - 1);
    const Tensor a = random_tensor(shape, 60).to(gpu()), b = random_tensor(shape, 61).to(gpu());
    const Tensor w = random_tensor({C}, 62).to(gpu()), dy = random_tensor(shape, 63).to(gpu());
    Tensor want_sum = Tensor::empty(shape, DType::F32, gpu()), want_y = Tensor::empty(shape, DType::F32, gpu());
    Tensor want_rstd = Tensor::empty(lead, DType::F32, gpu());
    kernels::add(a, b, want_sum);
    kernels::rmsnorm(want_sum, w, 1e-6, want_y, want_rstd);
    Tensor want_bf16 = Tensor::empty(shape, DType::BF16, gpu()), widened = Tensor::empty(shape, DType::F32, gpu());
    Tensor want_y_bf16 = Tensor::empty(shape, DType::BF16, gpu());
    kernels::convert(want_sum, want_bf16);
    kernels::convert(want_y, want_y_bf16);
    kernels::convert(want_bf16, widened);

    kernels::set_matmul_precision(kernels::MatmulPrecision::BF16Inputs);
    Tensor sum = Tensor::empty(shape, DType::F32, gpu()), y = Tensor::empty(shape, DType::F32, gpu());
    Tensor rstd = Tensor::empty(lead, DType::F32, gpu()), sum_bf16 = Tensor::empty(shape, DType::BF16, gpu());
    Tensor y_bf16 = Tensor::empty(shape, DType::BF16, gpu());
    kernels::add_rmsnorm(a, b, w, 1e-6, sum, y, rstd, sum_bf16, y_bf16);
    Tensor y_again = Tensor::empty(shape, DType::F32, gpu()), rstd_again = Tensor::empty(lead, DType::F32, gpu());
    Tensor x_bf16 = Tensor::empty(shape, DType::BF16, gpu()), y_again_bf16 = Tensor::empty(shape, DType::BF16, gpu());
    kernels::rmsnorm(want_sum, w, 1e-6, y_again, rstd_again, x_bf16, y_again_bf16);
    const Tensor dx0 = random_tensor(shape, 64).to(gpu());
    Tensor dx = Tensor::empty(shape, DType::F32, gpu()), dx_added = dx0.clone();
    Tensor dw = Tensor::zeros({C}, DType::F32, gpu()), dw_again = Tensor::zeros({C}, DType::F32, gpu());
    kernels::rmsnorm_backward(sum_bf16, w, rstd, dy, dx, dw);
    kernels::rmsnorm_backward(sum_bf16, w, rstd, dy, dx_added, dw_again, 1.0);
    kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
    EXPECT_THROW(kernels::rmsnorm_backward(sum_bf16, w, rstd, dy, dx, dw), Error);  // only under the mode

    Tensor want_dx = Tensor::empty(shape, DType::F32, gpu()), want_dx_added = dx0.clone();
    Tensor want_dw = Tensor::zeros({C}, DType::F32, gpu()), unused_dw = Tensor::zeros({C}, DType::F32, gpu());
    kernels::rmsnorm_backward(widened, w, rstd, dy, want_dx, want_dw);
    kernels::rmsnorm_backward(widened, w, rstd, dy, want_dx_added, unused_dw, 1.0);
    for (const auto& [what, got, want] : std::vector<std::tuple<std::string, Tensor, Tensor>>{
             {"sum", sum, want_sum},
             {"y", y, want_y},
             {"rstd", rstd, want_rstd},
             {"sum_bf16", sum_bf16, want_bf16},
             {"y_bf16", y_bf16, want_y_bf16},
             {"rmsnorm x_bf16", x_bf16, want_bf16},
             {"rmsnorm y_bf16", y_again_bf16, want_y_bf16},
             {"rmsnorm y", y_again, want_y},
             {"rmsnorm rstd", rstd_again, want_rstd},
             {"dx", dx, want_dx},
             {"dx added to", dx_added, want_dx_added},
             {"dw", dw, want_dw},
             {"dw again", dw_again, want_dw}})
      EXPECT_EQ(host_bytes(got), host_bytes(want)) << what;
  }
}

// No atomics in the column sums (RMSNorm's dw among them, which the table compares only to rounding)
// or the scatter-add: two runs on the device give the same bits.
TEST_F(CudaDevice, ColumnSumsAndTheScatterAddRepeatBitForBit) {
  const int64_t rows = 130, cols = 300, sources = 520;
  const Tensor x = random_tensor({rows, cols}, 51).to(gpu()), dy = random_tensor({rows, cols}, 52).to(gpu());
  const Tensor w = random_tensor({cols}, 53).to(gpu()), src = random_tensor({sources, cols}, 54).to(gpu());
  Tensor y = Tensor::empty({rows, cols}, DType::F32, gpu()), rstd = Tensor::empty({rows}, DType::F32, gpu());
  kernels::rmsnorm(x, w, 1e-6, y, rstd);
  const Tensor idx = Tensor::zeros({sources}, DType::I64, gpu());  // one segment across three sort chunks
  auto run = [&] {
    Tensor dx = Tensor::empty({rows, cols}, DType::F32, gpu()), dw = Tensor::zeros({cols}, DType::F32, gpu());
    kernels::rmsnorm_backward(x, w, rstd, dy, dx, dw);
    Tensor sums = Tensor::empty({cols}, DType::F32, gpu()), inv_norm = Tensor::empty({cols}, DType::F32, gpu());
    kernels::sum_to(x, sums);
    kernels::column_inv_norm(x, 1e-6, inv_norm);
    Tensor acc = Tensor::zeros({3, cols}, DType::F32, gpu());
    kernels::scatter_add_rows(src, idx, acc);
    return std::vector<Tensor>{dw, sums, inv_norm, acc};
  };
  const std::vector<Tensor> first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(host_bytes(first[i]), host_bytes(second[i])) << "output " << i;
}

TEST_F(CudaDevice, CachingAllocatorReusesDeviceBlocks) {
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
