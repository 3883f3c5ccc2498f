// `lingtrain bench`: how fast lingtrain trains on this machine, in numbers that compare across
// machines and against the PyTorch peer torch_ling.py (docs/performance.md): the FMA peak, GEMM
// efficiency against it, and whole training steps of the bench configs (tokens/s, achieved GFLOP/s,
// MFU, memory, allocations).
// Results go to stdout as readable lines, and the last line is one JSON object.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/json.h"
#include "tensor/kernel_types.h"

namespace lt::bench {

// The bench configs (the table in docs/performance.md, shared with the peer) and their batch x seq
// shapes.
struct BenchShape {
  int64_t batch = 0, seq = 0;
};
const std::vector<std::string>& bench_config_names();
// The bench shape of a bench config; other configs have none and fail with a clear message.
BenchShape bench_shape(const std::string& config_name);

struct StepBenchOptions {
  std::string config;          // a preset name or a config.json path
  int64_t batch = 0, seq = 0;  // 0: the config's bench shape
  int64_t steps = 10, warmup = 3;
  uint64_t seed = 1;
  bool profile = false;  // per-op breakdown of the measured steps (autograd/profile.h)
  std::string device = "cpu";  // --device: cpu, cuda or cuda:N (tensor/device.h)
  kernels::MatmulPrecision matmul_precision = kernels::MatmulPrecision::F32;  // --dtype bf16 or tf32
};

// The dense peaks of a GPU, by its name (the vendor's datasheet figures, TFLOP/s): bf16 on the tensor
// cores, the MFU reference of mixed-precision training, and f32 without them. 0 for a GPU not listed.
struct GpuPeak {
  double bf16_tflops = 0, f32_tflops = 0;
};
GpuPeak gpu_peak(const std::string& device_description);

// Training steps of one config in this process, on lt's current thread count or on a GPU (--device): random tokens (fixed
// seed), AdamW lr 3e-4 weight decay 0.1, clipping at 1.0, the config's aux and z losses and NormHead.
// Prints a summary (and the per-op table when profiling) and returns the JSON result.
Json run_step_bench(const StepBenchOptions& options);

struct GenerationBenchOptions {
  std::string config;         // a preset name or a config.json path
  int64_t rows = 16;          // prompts, decoded one at a time and then together
  int64_t new_tokens = 64;    // per prompt (no stop id: every row runs to its limit)
  uint64_t seed = 1;          // weights and prompts
  std::string device = "cpu";
};

// Greedy generation with random weights: `rows` ragged prompts (8 to 40 tokens) decoded one at a time
// (generate) and then together (generate_batch); the tokens/s of each, their ratio, and whether every
// row's tokens agree. Prints a summary and returns the JSON result.
Json run_generation_bench(const GenerationBenchOptions& options);

// The FMA peak on 1 and `threads` threads and GEMM GFLOP/s at square and model shapes on both.
Json run_kernel_bench(int threads);

// Everything (or one part): the kernel bench, then each bench config in a fresh process of this
// executable (peak RSS is per process, so a config measured after another would inherit its
// high-water mark).
enum class BenchPart { All, Kernels, Steps };
BenchPart parse_bench_part(const std::string& name);  // "all", "kernels" or "steps"
Json run_all(BenchPart part, int threads, int64_t steps, int64_t warmup, bool profile);

}  // namespace lt::bench
