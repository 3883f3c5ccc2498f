#include "bench/bench.h"

#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include "autograd/profile.h"
#include "bench/flops.h"
#include "bench/fma_peak.h"
#include "data/bpe_tokenizer.h"
#include "data/bpe_trainer.h"
#include "data/corpus.h"
#include "io/format_text.h"
#include "tensor/derive_seed.h"
#include "model/ling.h"
#include "tensor/allocator.h"
#include "tensor/device_counters.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"
#include "trainer/generate.h"
#include "trainer/trainer.h"

extern char** environ;

namespace lt::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// The process's resident-set high-water mark. VmHWM belongs to the address space, which exec
// replaces, while getrusage's ru_maxrss survives exec: a config run in a child spawned by `bench`
// would report the parent's GEMM buffers. ru_maxrss (KiB) is the fallback where /proc is missing.
double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;  // "VmHWM: N kB"
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// Rounded for the JSON line, so it stays readable.
double round_to(double value, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(value * scale) / scale;
}

// Uniform random token ids: the loss stays near ln(vocab), which is all a speed measurement needs, and
// routing sees a spread of tokens as it would on text.
TokenBatch random_batch(Rng& rng, int64_t B, int64_t T, int64_t vocab) {
  std::vector<int32_t> inputs(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t previous = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    for (int64_t t = 0; t < T; ++t) {
      const int32_t next = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
      inputs[static_cast<size_t>(b * T + t)] = previous;
      targets[static_cast<size_t>(b * T + t)] = next;
      previous = next;
    }
  }
  return {Tensor::from_vector<int32_t>({B, T}, inputs), Tensor::from_vector<int32_t>({B, T}, targets)};
}

// The per-op table of the measured steps, printed and returned as JSON rows; on a GPU with each op's
// launches and host syncs per step.
Json report_profile(int64_t steps, double mean_step_seconds, bool on_device) {
  const std::vector<profile::OpTime> ops = profile::report();
  const double per_step = 1.0 / static_cast<double>(steps);
  std::printf(
      "per-op self time over %lld measured steps (ms per step, %% of the mean step of %.2f ms; wait: the threads'\n"
      "time at the ends of the op's fork-joins, ms of thread time per step):\n",
      static_cast<long long>(steps), mean_step_seconds * 1e3);
  std::printf("  %-30s %-9s %10s %7s %11s %10s", "op", "phase", "ms/step", "%step", "calls/step", "wait ms");
  std::printf(on_device ? " %9s %8s\n" : "\n", "launches", "syncs");
  Json rows = Json::array();
  double profiled = 0;
  for (const profile::OpTime& op : ops) {
    const double ms = op.seconds * per_step * 1e3;
    const double percent = 100.0 * op.seconds * per_step / mean_step_seconds;
    const double calls = static_cast<double>(op.calls) * per_step;
    profiled += op.seconds * per_step;
    const double wait_ms = op.wait_seconds * per_step * 1e3;
    const double launches = static_cast<double>(op.launches) * per_step;
    const double host_syncs = static_cast<double>(op.host_syncs) * per_step;
    std::printf("  %-30s %-9s %10.3f %6.1f%% %11.1f %10.3f", op.name.c_str(), profile::phase_name(op.phase), ms,
                percent, calls, wait_ms);
    if (on_device) std::printf(" %9.1f %8.1f", launches, host_syncs);
    std::printf("\n");
    rows.push_back({{"op", op.name},
                    {"phase", profile::phase_name(op.phase)},
                    {"ms_per_step", round_to(ms, 4)},
                    {"percent", round_to(percent, 2)},
                    {"calls_per_step", calls},
                    {"wait_ms_per_step", round_to(wait_ms, 4)},
                    {"launches_per_step", launches},
                    {"host_syncs_per_step", host_syncs}});
  }
  const double outside = mean_step_seconds - profiled;
  std::printf("  %-30s %-9s %10.3f %6.1f%%\n", "(outside every scope)", "", outside * 1e3,
              100.0 * outside / mean_step_seconds);
  rows.push_back({{"op", "(outside every scope)"},
                  {"phase", ""},
                  {"ms_per_step", round_to(outside * 1e3, 4)},
                  {"percent", round_to(100.0 * outside / mean_step_seconds, 2)},
                  {"calls_per_step", 0}});
  return rows;
}

// What the device was asked per measured step (or other unit, `per`) (tensor/device_counters.h), with the
// allocator's part: printed for a GPU run, and returned as JSON.
Json report_device_counters(const DeviceCounters& c, const AllocatorStats& start, const AllocatorStats& end,
                            int64_t steps, bool print, const char* per = "step") {
  const double n = static_cast<double>(steps);
  auto per_step = [n](uint64_t count) { return round_to(static_cast<double>(count) / n, 1); };
  const uint64_t allocations = end.allocations - start.allocations;
  const uint64_t driver_allocations = end.system_allocs - start.system_allocs;
  if (print)
    std::printf(
      "per %s on the device: %.0f launches, %.1f host syncs, %.1f copies to the host (%.1f KiB), %.1f from it "
      "(%.1f KiB), %.1f within it; %.0f GEMM calls (%.2f GFLOP); %.0f allocations, %.1f from the driver\n",
      per, per_step(c.launches), per_step(c.host_syncs), per_step(c.d2h_copies), per_step(c.d2h_bytes) / 1024,
      per_step(c.h2d_copies), per_step(c.h2d_bytes) / 1024, per_step(c.d2d_copies), per_step(c.blas_calls),
      per_step(c.blas_flops) / 1e9, per_step(allocations), per_step(driver_allocations));
  return {{"launches", per_step(c.launches)},
          {"host_syncs", per_step(c.host_syncs)},
          {"d2h_copies", per_step(c.d2h_copies)},
          {"d2h_bytes", per_step(c.d2h_bytes)},
          {"h2d_copies", per_step(c.h2d_copies)},
          {"h2d_bytes", per_step(c.h2d_bytes)},
          {"d2d_copies", per_step(c.d2d_copies)},
          {"d2d_bytes", per_step(c.d2d_bytes)},
          {"blas_calls", per_step(c.blas_calls)},
          {"blas_gflop", round_to(static_cast<double>(c.blas_flops) / n / 1e9, 4)},
          {"allocations", per_step(allocations)},
          {"driver_allocations", per_step(driver_allocations)}};
}

// ---- GEMM shapes --------------------------------------------------------------------------------

// c [M, N] = op(a) [M, K] op(b) [K, N]. The model shapes are those of the bench configs' steps: a
// Linear forward is x W^T (weights stored [out, in]), its weight gradient g^T x, its input gradient
// g W; the routed experts see about tokens * top_k / experts rows each.
struct GemmCase {
  const char* label;
  int64_t M, N, K;
  bool trans_a, trans_b;
};

const std::vector<GemmCase>& gemm_cases() {
  static const std::vector<GemmCase> cases = {
      {"square 256", 256, 256, 256, false, false},
      {"square 512", 512, 512, 512, false, false},
      {"square 1024", 1024, 1024, 1024, false, false},
      {"square 2048", 2048, 2048, 2048, false, false},
      {"moe-s qkv x W^T", 1024, 768, 256, false, true},
      {"moe-s qkv dW = g^T x", 768, 256, 1024, true, false},
      {"moe-s expert gate x W^T", 256, 128, 256, false, true},
      {"moe-s expert down x W^T", 256, 256, 128, false, true},
      {"moe-s lm_head x W^T", 1024, 4096, 256, false, true},
      {"moe-s lm_head dx = g W", 1024, 256, 4096, false, false},
      {"moe-m qkv x W^T", 2048, 1536, 512, false, true},
      {"moe-m expert gate x W^T", 256, 256, 512, false, true},
      {"moe-m lm_head x W^T", 2048, 8192, 512, false, true},
      {"dense-124m mlp up x W^T", 256, 2048, 768, false, true},
      {"dense-124m mlp down x W^T", 256, 768, 2048, false, true},
      {"dense-124m lm_head x W^T", 256, 50257, 768, false, true},
  };
  return cases;
}

// The median rate of repeated calls after one untimed call (first touch of the output, packing).
double gemm_gflops(const GemmCase& c, Rng& rng) {
  const Tensor a = Tensor::randn(c.trans_a ? Shape{c.K, c.M} : Shape{c.M, c.K}, rng);
  const Tensor b = Tensor::randn(c.trans_b ? Shape{c.N, c.K} : Shape{c.K, c.N}, rng);
  Tensor out = Tensor::empty({c.M, c.N});
  kernels::matmul(a, c.trans_a, b, c.trans_b, out);
  std::vector<double> seconds;
  const Clock::time_point start = Clock::now();
  while (seconds.size() < 3 || (seconds_between(start, Clock::now()) < 0.2 && seconds.size() < 1000)) {
    const Clock::time_point t0 = Clock::now();
    kernels::matmul(a, c.trans_a, b, c.trans_b, out);
    seconds.push_back(seconds_between(t0, Clock::now()));
  }
  return 2.0 * static_cast<double>(c.M) * static_cast<double>(c.N) * static_cast<double>(c.K) / median(seconds) / 1e9;
}

// ---- running a config in a fresh process ----------------------------------------------------------

std::string self_executable() {
  std::vector<char> path(4096);
  const ssize_t length = readlink("/proc/self/exe", path.data(), path.size() - 1);
  LT_CHECK(length > 0, "bench: cannot find this executable through /proc/self/exe");
  return std::string(path.data(), static_cast<size_t>(length));
}

// Runs argv with its stdout passed through to ours as it arrives, and returns that output.
std::string run_passing_output_through(const std::vector<std::string>& argv) {
  std::fflush(stdout);
  int pipe_fds[2];
  LT_CHECK(pipe(pipe_fds) == 0, "bench: pipe() failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
  posix_spawn_file_actions_addclose(&actions, pipe_fds[1]);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    fail("bench: cannot start ", argv[0], " (error ", spawned, ")");
  }
  std::string output;
  char buffer[4096];
  ssize_t got = 0;
  while ((got = read(pipe_fds[0], buffer, sizeof buffer)) > 0) {
    output.append(buffer, static_cast<size_t>(got));
    std::fwrite(buffer, 1, static_cast<size_t>(got), stdout);
    std::fflush(stdout);
  }
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::string command;
  for (size_t i = 1; i < argv.size(); ++i) command += (i > 1 ? " " : "") + argv[i];
  LT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "bench: `lingtrain ", command, "` failed (status ", status,
           ")");
  return output;
}

std::string last_line(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const size_t newline = text.rfind('\n');
  return newline == std::string::npos ? text : text.substr(newline + 1);
}

}  // namespace

const std::vector<std::string>& bench_config_names() {
  static const std::vector<std::string> names = {"moe-s", "moe-m", "dense-124m"};
  return names;
}

BenchShape bench_shape(const std::string& config_name) {
  if (config_name == "moe-s") return {4, 256};
  if (config_name == "moe-m") return {4, 512};
  if (config_name == "dense-124m") return {4, 64};
  // Ling-Lite's layers, four of them (2.8B parameters, 45 GB of f32 weights, gradients and AdamW
  // state): the released shapes on one GPU. Not among the CPU defaults.
  if (config_name == "ling-lite-4l") return {2, 2048};
  fail("bench: config '", config_name, "' has no bench shape (bench configs: moe-s, moe-m, dense-124m, ling-lite-4l); pass --batch and --seq");
}

GpuPeak gpu_peak(const std::string& name) {
  // Checked in order: the PCIe H100 has lower clocks than the SXM one the plain name means.
  const std::vector<std::pair<std::string, GpuPeak>> table = {
      {"H100 PCIe", {756, 51}}, {"H100", {989, 67}}, {"H200", {989, 67}}, {"H800", {989, 67}},
      {"A100", {312, 19.5}},    {"A10", {125, 31.2}}, {"L40S", {362, 91.6}}, {"L4", {121, 30.3}}};
  for (const auto& [key, peak] : table)
    if (name.find(key) != std::string::npos) return peak;
  return {};
}

Json run_step_bench(const StepBenchOptions& o) {
  const LingConfig config = resolve_config(o.config);
  BenchShape shape{o.batch, o.seq};
  if (shape.batch == 0 || shape.seq == 0) {
    const BenchShape preset = bench_shape(config.name);
    if (shape.batch == 0) shape.batch = preset.batch;
    if (shape.seq == 0) shape.seq = preset.seq;
  }
  const int64_t B = shape.batch, T = shape.seq;
  LT_CHECK(T <= config.max_position_embeddings, "bench: --seq ", T, " exceeds max_position_embeddings ",
           config.max_position_embeddings, " of ", o.config);
  const int threads = num_threads();
  const Device device = parse_device(o.device);
  const bool bf16 = o.matmul_precision == kernels::MatmulPrecision::BF16Inputs;
  LT_CHECK(!bf16 || !device.is_cpu() || kernels::cpu_has_bf16_matmul(),
           "bench: --dtype bf16 on the CPU needs AVX512_BF16, which this CPU does not have");
  // The MFU reference: the CPU's measured FMA peak (under --dtype bf16 the peak of the bf16 GEMM's
  // instruction, AMX tiles or VDPBF16PS, with f32's beside it), or the GPU's bf16 tensor-core peak.
  const std::string device_name = device.is_cpu() ? cpu_kernel_target() : cuda_device_description(device.index);
  const GpuPeak gpu = device.is_cpu() ? GpuPeak{} : gpu_peak(device_name);
  const double fma_peak_gflops = device.is_cpu() ? measure_fma_peak(threads).gflops : 0.0;
  const FmaPeak bf16_peak = device.is_cpu() && bf16 ? measure_bf16_peak(threads) : FmaPeak{};
  const double peak_gflops = !device.is_cpu() ? gpu.bf16_tflops * 1e3 : bf16 ? bf16_peak.gflops : fma_peak_gflops;
  const TrainingFlops flops = training_flops(config, T);
  kernels::set_matmul_precision(o.matmul_precision);
  LingForCausalLM model(config, o.seed);
  model.to(device);
  TrainerSettings settings;
  settings.adam.weight_decay = 0.1;
  settings.clip = 1.0;
  settings.schedule.kind = "constant";
  settings.schedule.peak = 3e-4;
  settings.seed = o.seed;
  Trainer trainer(model, settings);
  double param_bytes = 0, adam_bytes = 0;
  int64_t total_params = 0;
  for (const FlatParameters::ParameterRange& p : trainer.parameters().parameters()) {
    param_bytes += static_cast<double>(p.parameter.value->value().nbytes());
    total_params += p.parameter.value->value().numel();
  }
  for (const auto& [name, moment] : trainer.optimizer().state()) adam_bytes += static_cast<double>(moment.nbytes());

  // The data stream apart from the trainer's routing-noise stream, both fixed by the seed.
  Rng data_rng(derive_seed(o.seed, 2));
  const int64_t total_steps = o.warmup + o.steps;
  std::vector<std::vector<TokenBatch>> batches;
  for (int64_t i = 0; i < total_steps; ++i) batches.push_back({random_batch(data_rng, B, T, config.vocab_size)});

  if (device.is_cpu())
    std::printf("%s: batch %lld x seq %lld, %s (%s), %s matmuls, %lld warm-up + %lld measured steps\n",
                config.name.c_str(), static_cast<long long>(B), static_cast<long long>(T),
                count_of(threads, "thread").c_str(), device_name.c_str(),
                kernels::matmul_precision_name(o.matmul_precision), static_cast<long long>(o.warmup),
                static_cast<long long>(o.steps));
  else
    std::printf("%s: batch %lld x seq %lld on %s (%s), %s matmuls, %lld warm-up + %lld measured steps\n",
                config.name.c_str(), static_cast<long long>(B), static_cast<long long>(T), device.str().c_str(),
                device_name.c_str(), kernels::matmul_precision_name(o.matmul_precision), static_cast<long long>(o.warmup),
                static_cast<long long>(o.steps));
  std::fflush(stdout);

  CachingAllocator& allocator = allocator_for(device);
  AllocatorStats at_measure_start;
  DeviceCounters counters_at_measure_start;
  int64_t pool_wait_at_measure_start = 0;
  std::vector<double> step_s, forward_s, backward_s, optimizer_s;
  double loss_first = 0, loss_last = 0;
  for (int64_t i = 0; i < total_steps; ++i) {
    if (i == o.warmup) {
      at_measure_start = allocator.stats();
      counters_at_measure_start = device_counters();
      pool_wait_at_measure_start = pool_wait_ns();
      if (o.profile) {
        profile::reset();
        profile::enable();
      }
    }
    const StepStats stats = trainer.step(batches[i]);
    if (i == 0) loss_first = stats.loss;
    loss_last = stats.loss;
    if (i < o.warmup) continue;
    step_s.push_back(stats.seconds);
    forward_s.push_back(stats.forward_seconds);
    backward_s.push_back(stats.backward_seconds);
    optimizer_s.push_back(stats.optimizer_seconds);
  }
  profile::disable();
  const AllocatorStats at_end = allocator.stats();
  const DeviceCounters counters = device_counters() - counters_at_measure_start;
  const double pool_wait_ms =
      static_cast<double>(pool_wait_ns() - pool_wait_at_measure_start) / 1e6 / static_cast<double>(o.steps);

  const double step = median(step_s);
  const double tokens_per_s = static_cast<double>(B * T) / step;
  const double gflops = flops.per_token * tokens_per_s / 1e9;
  const double mfu = peak_gflops > 0 ? gflops / peak_gflops : 0.0;
  const uint64_t system_allocs = at_end.system_allocs - at_measure_start.system_allocs;
  const double held = static_cast<double>(at_measure_start.bytes_in_use);
  const double peak_in_use = static_cast<double>(at_end.peak_bytes_in_use);
  const double rss = peak_rss_mib();

  std::printf("step %.2f ms median (min %.2f, max %.2f): forward %.2f, backward %.2f, clip + AdamW %.2f ms\n",
              step * 1e3, *std::min_element(step_s.begin(), step_s.end()) * 1e3,
              *std::max_element(step_s.begin(), step_s.end()) * 1e3, median(forward_s) * 1e3,
              median(backward_s) * 1e3, median(optimizer_s) * 1e3);
  if (device.is_cpu() && bf16)
    std::printf(
        "%.0f tokens/s, %.1f GFLOP/s at %.2f MFLOP/token; bf16 peak (%s) %.1f GFLOP/s on %s: "
        "MFU %.1f%% (f32 FMA peak %.1f GFLOP/s: %.1f%%)\n",
        tokens_per_s, gflops, flops.per_token / 1e6, bf16_peak.target, peak_gflops, count_of(threads, "thread").c_str(),
        100.0 * mfu,
        fma_peak_gflops, 100.0 * gflops / fma_peak_gflops);
  else if (device.is_cpu())
    std::printf("%.0f tokens/s, %.1f GFLOP/s at %.2f MFLOP/token; FMA peak %.1f GFLOP/s on %s: MFU %.1f%%\n",
                tokens_per_s, gflops, flops.per_token / 1e6, peak_gflops, count_of(threads, "thread").c_str(), 100.0 * mfu);
  else if (peak_gflops > 0)
    std::printf("%.0f tokens/s, %.1f GFLOP/s at %.2f MFLOP/token; bf16 peak %.0f TFLOP/s: MFU %.1f%% (f32 peak %.1f "
                "TFLOP/s: %.1f%%)\n",
                tokens_per_s, gflops, flops.per_token / 1e6, gpu.bf16_tflops, 100.0 * mfu, gpu.f32_tflops,
                100.0 * gflops / (gpu.f32_tflops * 1e3));
  else
    std::printf("%.0f tokens/s, %.1f GFLOP/s at %.2f MFLOP/token; no peak on record for this GPU: no MFU\n",
                tokens_per_s, gflops, flops.per_token / 1e6);
  std::printf("memory (%s): parameters %.1f MiB, AdamW state %.1f MiB, held between steps %.1f MiB, peak in use "
              "%.1f MiB (%.1f MiB of activations, gradients and temporaries), peak host RSS %.1f MiB\n",
              device.str().c_str(), mib(param_bytes), mib(adam_bytes), mib(held), mib(peak_in_use),
              mib(peak_in_use - held), rss);
  std::printf("system allocations during the measured steps: %llu; loss %.4f -> %.4f\n",
              static_cast<unsigned long long>(system_allocs), loss_first, loss_last);
  // The mean, not the median: waits are what the steps' spread is made of.
  if (device.is_cpu() && threads > 1)
    std::printf(
        "threads waiting at the ends of fork-joins: %.2f ms of thread time per step (%.1f%% of %d threads' "
        "time)\n",
        pool_wait_ms, 100.0 * pool_wait_ms / (threads * step * 1e3), threads);

  Json result = {{"config", config.name},
                 {"threads", threads},
                 {"batch", B},
                 {"seq", T},
                 {"warmup", o.warmup},
                 {"steps", o.steps},
                 {"cpu_target", cpu_kernel_target()},
                 {"cpu_l2_kib", cpu_l2_cache_bytes() >> 10},
                 {"device", device.str()},
                 {"device_name", device_name},
                 {"matmul_dtype", kernels::matmul_precision_name(o.matmul_precision)},
                 {"step_ms", round_to(step * 1e3, 3)},
                 {"step_ms_min", round_to(*std::min_element(step_s.begin(), step_s.end()) * 1e3, 3)},
                 {"step_ms_max", round_to(*std::max_element(step_s.begin(), step_s.end()) * 1e3, 3)},
                 {"forward_ms", round_to(median(forward_s) * 1e3, 3)},
                 {"backward_ms", round_to(median(backward_s) * 1e3, 3)},
                 {"optimizer_ms", round_to(median(optimizer_s) * 1e3, 3)},
                 {"tokens_per_s", round_to(tokens_per_s, 1)},
                 {"flops_per_token", flops.per_token},
                 {"active_matmul_params", flops.active_matmul_params},
                 {"total_params", total_params},
                 {"gflops", round_to(gflops, 2)},
                 {"peak_gflops", round_to(peak_gflops, 2)},
                 {"peak_unit", !device.is_cpu() ? "tensor cores"
                               : bf16           ? bf16_peak.target
                                                : "FMA"},
                 {"mfu", round_to(mfu, 4)},
                 {"peak_rss_mb", round_to(rss, 1)},
                 {"system_allocs_in_steady_state", system_allocs},
                 {"pool_wait_ms_per_step", round_to(pool_wait_ms, 3)},
                 {"param_mb", round_to(mib(param_bytes), 2)},
                 {"adamw_state_mb", round_to(mib(adam_bytes), 2)},
                 {"held_between_steps_mb", round_to(mib(held), 2)},
                 {"peak_in_use_mb", round_to(mib(peak_in_use), 2)},
                 {"step_transient_peak_mb", round_to(mib(peak_in_use - held), 2)},
                 {"loss_first", round_to(loss_first, 4)},
                 {"loss_last", round_to(loss_last, 4)}};
  // Per step, with its unit in each name (calls, bytes, GFLOP). Zero on the CPU, reported there too so
  // that every bench line has the same fields.
  result["device_per_step"] = report_device_counters(counters, at_measure_start, at_end, o.steps, !device.is_cpu());
  if (o.profile) {
    double total = 0;
    for (double s : step_s) total += s;
    result["ops"] = report_profile(o.steps, total / static_cast<double>(step_s.size()), !device.is_cpu());
  }
  std::fflush(stdout);
  return result;
}

// Byte-level BPE on the embedded corpus (all five domains): training a 4096-token vocabulary on 1 MB,
// then encoding and decoding 4 MB in one thread. Speeds in MB of text per second.
Json run_tokenizer_bench() {
  std::string text;
  for (const CorpusDocument& document : generate_corpus(1, size_t{4} << 20)) text += document.text;
  const std::string_view training(text.data(), std::min<size_t>(text.size(), size_t{1} << 20));
  BpeTrainSettings settings;
  settings.vocab_size = 4096;
  const Clock::time_point train_start = Clock::now();
  const BpeTokenizer tokenizer = BpeTokenizer::from_json(train_bpe({training}, settings), "bench tokenizer");
  const double train_s = seconds_between(train_start, Clock::now());
  const Clock::time_point encode_start = Clock::now();
  const std::vector<uint32_t> ids = tokenizer.encode(text);
  const double encode_s = seconds_between(encode_start, Clock::now());
  const Clock::time_point decode_start = Clock::now();
  const std::string decoded = tokenizer.decode(ids);
  const double decode_s = seconds_between(decode_start, Clock::now());
  LT_CHECK(decoded == text, "bench: the BPE round trip changed the text");
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("BPE tokenizer (pattern %s, vocab %d, 1 thread): trained on 1 MB in %.2f s; %.1f MB encoded at %.1f MB/s "
              "(%.2f bytes/token), decoded at %.1f MB/s\n",
              settings.pattern.c_str(), static_cast<int>(settings.vocab_size), train_s, mb, mb / encode_s,
              static_cast<double>(text.size()) / static_cast<double>(ids.size()), mb / decode_s);
  return {{"pattern", settings.pattern},
          {"vocab_size", settings.vocab_size},
          {"train_s", round_to(train_s, 3)},
          {"text_mb", round_to(mb, 2)},
          {"encode_mb_per_s", round_to(mb / encode_s, 2)},
          {"decode_mb_per_s", round_to(mb / decode_s, 2)},
          {"bytes_per_token", round_to(static_cast<double>(text.size()) / static_cast<double>(ids.size()), 3)}};
}

Json run_kernel_bench(int threads) {
  const int previous_threads = num_threads();
  std::vector<int> thread_counts = {1};
  if (threads > 1) thread_counts.push_back(threads);
  Json peaks = Json::array();
  std::vector<double> peak_of;
  for (int n : thread_counts) {
    const FmaPeak peak = measure_fma_peak(n);
    std::printf("FMA peak (Highway %s): %d thread%s %.1f GFLOP/s\n", peak.target, n, n == 1 ? "" : "s", peak.gflops);
    peaks.push_back({{"threads", n}, {"gflops", round_to(peak.gflops, 2)}, {"target", peak.target}});
    peak_of.push_back(peak.gflops);
  }
  std::printf("GEMM (kernels::matmul, f32, median of repeated calls, L2 %lld KiB): GFLOP/s and %% of the FMA peak\n",
              static_cast<long long>(cpu_l2_cache_bytes() >> 10));
  std::printf("  %-28s %6s %6s %6s %2s", "shape", "M", "N", "K", "op");
  for (int n : thread_counts) std::printf("  %3d thr GF/s  %%peak", n);
  std::printf("\n");
  Rng rng(7);
  Json rows = Json::array();
  for (const GemmCase& c : gemm_cases()) {
    std::printf("  %-28s %6lld %6lld %6lld %c%c", c.label, static_cast<long long>(c.M), static_cast<long long>(c.N),
                static_cast<long long>(c.K), c.trans_a ? 'T' : 'N', c.trans_b ? 'T' : 'N');
    Json row = {{"shape", c.label}, {"M", c.M}, {"N", c.N}, {"K", c.K}, {"trans_a", c.trans_a}, {"trans_b", c.trans_b}};
    Json by_threads = Json::array();
    for (size_t i = 0; i < thread_counts.size(); ++i) {
      set_num_threads(thread_counts[i]);
      const double gflops = gemm_gflops(c, rng);
      std::printf("  %12.1f %5.1f%%", gflops, 100.0 * gflops / peak_of[i]);
      by_threads.push_back({{"threads", thread_counts[i]},
                            {"gflops", round_to(gflops, 2)},
                            {"percent_of_peak", round_to(100.0 * gflops / peak_of[i], 2)}});
    }
    std::printf("\n");
    std::fflush(stdout);
    row["results"] = by_threads;
    rows.push_back(row);
  }
  set_num_threads(previous_threads);
  return {{"fma_peak", peaks},
          {"cpu_l2_kib", cpu_l2_cache_bytes() >> 10},
          {"gemm", rows},
          {"tokenizer", run_tokenizer_bench()}};
}

Json run_generation_bench(const GenerationBenchOptions& o) {
  const LingConfig config = resolve_config(o.config);
  const Device device = parse_device(o.device);
  LingForCausalLM model(config, o.seed);
  model.to(device);
  Rng rng(derive_seed(o.seed, 1));
  std::vector<std::vector<uint32_t>> prompts;
  for (int64_t r = 0; r < o.rows; ++r) {
    std::vector<uint32_t> prompt(static_cast<size_t>(8 + (r * 7) % 33));
    for (uint32_t& id : prompt) id = static_cast<uint32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
    prompts.push_back(prompt);
  }
  SamplingSettings greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = o.new_tokens;
  // Warm-up of both ways: the allocator's caches (a batch's larger activations included), the thread pool.
  generate(model, prompts[0], greedy, config.vocab_size);
  generate_batch(model, prompts, greedy, config.vocab_size);
  // Wall time, and the process's CPU time beside it: on a machine shared with other work the wall time of
  // one thread also counts the time it waited for a core, the CPU time does not.
  // What each way asks of the device, per new token (printed on a GPU).
  CachingAllocator& allocator = allocator_for(device);
  const AllocatorStats alone_allocator = allocator.stats();
  const DeviceCounters alone_counters = device_counters();
  const Clock::time_point alone_start = Clock::now();
  const std::clock_t alone_cpu_start = std::clock();
  std::vector<std::vector<uint32_t>> alone;
  for (const std::vector<uint32_t>& prompt : prompts)
    alone.push_back(generate(model, prompt, greedy, config.vocab_size));
  const Clock::time_point together_start = Clock::now();
  const std::clock_t together_cpu_start = std::clock();
  const AllocatorStats together_allocator = allocator.stats();
  const DeviceCounters together_counters = device_counters();
  const std::vector<std::vector<uint32_t>> together = generate_batch(model, prompts, greedy, config.vocab_size);
  const Clock::time_point end = Clock::now();
  const std::clock_t cpu_end = std::clock();
  const DeviceCounters end_counters = device_counters();
  const AllocatorStats end_allocator = allocator.stats();
  const double tokens = static_cast<double>(o.rows * o.new_tokens);
  auto cpu_seconds = [](std::clock_t from, std::clock_t to) { return static_cast<double>(to - from) / CLOCKS_PER_SEC; };
  const double alone_tps = tokens / seconds_between(alone_start, together_start);
  const double together_tps = tokens / seconds_between(together_start, end);
  const double alone_cpu_tps = tokens / cpu_seconds(alone_cpu_start, together_cpu_start);
  const double together_cpu_tps = tokens / cpu_seconds(together_cpu_start, cpu_end);
  std::printf("generation %s on %s, %d threads: %lld prompts x %lld new tokens: one at a time %.1f tokens/s, together "
              "%.1f tokens/s (x%.2f; per CPU second x%.2f), same tokens: %s\n",
              config.name.c_str(), o.device.c_str(), num_threads(), static_cast<long long>(o.rows),
              static_cast<long long>(o.new_tokens), alone_tps, together_tps, together_tps / alone_tps,
              together_cpu_tps / alone_cpu_tps, together == alone ? "yes" : "no");
  const bool on_gpu = !device.is_cpu();
  if (on_gpu) std::printf("one at a time, ");
  const Json alone_device = report_device_counters(together_counters - alone_counters, alone_allocator,
                                                   together_allocator, o.rows * o.new_tokens, on_gpu, "new token");
  if (on_gpu) std::printf("together, ");
  const Json together_device = report_device_counters(end_counters - together_counters, together_allocator,
                                                      end_allocator, o.rows * o.new_tokens, on_gpu, "new token");
  return {{"config", config.name},
          {"device", o.device},
          {"threads", num_threads()},
          {"rows", o.rows},
          {"new_tokens", o.new_tokens},
          {"one_at_a_time_tokens_per_s", alone_tps},
          {"together_tokens_per_s", together_tps},
          {"speedup", together_tps / alone_tps},
          {"one_at_a_time_tokens_per_cpu_s", alone_cpu_tps},
          {"together_tokens_per_cpu_s", together_cpu_tps},
          {"one_at_a_time_device_per_token", alone_device},
          {"together_device_per_token", together_device},
          {"speedup_per_cpu_s", together_cpu_tps / alone_cpu_tps},
          {"same_tokens", together == alone}};
}

BenchPart parse_bench_part(const std::string& name) {
  if (name == "all") return BenchPart::All;
  if (name == "kernels") return BenchPart::Kernels;
  if (name == "steps") return BenchPart::Steps;
  fail("flag --part must be all, kernels or steps, got '", name, "'");
}

Json run_all(BenchPart part, int threads, int64_t steps, int64_t warmup, bool profile) {
  Json result = part == BenchPart::Steps ? Json::object() : run_kernel_bench(threads);
  if (part == BenchPart::Kernels) return result;
  const std::string self = self_executable();
  Json configs = Json::array();
  for (const std::string& name : bench_config_names()) {
    std::printf("\n");
    const std::string output = run_passing_output_through(
        {self, "bench", "--config", name, "--threads", std::to_string(threads), "--steps", std::to_string(steps),
         "--warmup", std::to_string(warmup), "--profile", profile ? "1" : "0"});
    configs.push_back(parse_json(last_line(output), "the last line of `lingtrain bench --config " + name + "`"));
  }
  std::printf("\ntraining steps (each config in its own process, %s):\n", count_of(threads, "thread").c_str());
  std::printf("  %-11s %8s %10s %9s %8s %6s %12s %11s\n", "config", "tokens/s", "step ms", "GFLOP/s", "peak", "MFU",
              "peak RSS MiB", "sys allocs");
  for (const Json& c : configs)
    std::printf("  %-11s %8.0f %10.1f %9.1f %8.1f %5.1f%% %12.0f %11llu\n", c.at("config").get<std::string>().c_str(),
                c.at("tokens_per_s").get<double>(), c.at("step_ms").get<double>(), c.at("gflops").get<double>(),
                c.at("peak_gflops").get<double>(), 100.0 * c.at("mfu").get<double>(), c.at("peak_rss_mb").get<double>(),
                static_cast<unsigned long long>(c.at("system_allocs_in_steady_state").get<uint64_t>()));
  std::fflush(stdout);
  result["configs"] = configs;
  return result;
}

}  // namespace lt::bench
