// version, gradcheck, params, bench: what the build and the machine give, the backward checks, the
// parameter counts and the speed.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "model/gradcheck_cases.h"
#include "io/json.h"
#include "model/ling.h"
#include "tensor/cores.h"
#include "tensor/error.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

namespace lt::cli {

int cmd_version(const Args& args) {
  const Flags flags("lingtrain version: the version, the CPU kernel target and bf16 GEMM, threads, CUDA", {threads_flag()},
                    args);
  apply_threads(flags);
  std::printf("lingtrain %s\n", LINGTRAIN_VERSION);
  const char* bf16_unit = kernels::cpu_bf16_matmul_unit();
  std::printf("cpu kernels: Highway %s, %s%s%s, L2 %lld KiB per core\n", cpu_kernel_target(),
              bf16_unit ? "bf16 GEMM (" : "no bf16 GEMM (f32 under --dtype bf16)", bf16_unit ? bf16_unit : "",
              bf16_unit ? ")" : "", static_cast<long long>(cpu_l2_cache_bytes() >> 10));
  std::printf("threads: %d; this machine gives this process %s\n", num_threads(),
              describe_core_facts(read_core_facts()).c_str());
  if (cuda_compiled()) std::printf("cuda: compiled in, %d device(s) found\n%s", cuda_device_count(), cuda_device_list().c_str());
  else std::printf("cuda: not compiled in\n");
  return 0;
}

// Runs every gradient check and prints one line per op (the worst case of its variants).
int cmd_gradcheck(const Args& args) {
  const Flags flags("lingtrain gradcheck: a finite-difference check of every op's backward, one line per op",
                    {threads_flag(),
                     {"op", "", "check only this op"},
                     {"verbose", "0", "1: a line per variant of each op"}},
                    args);
  apply_threads(flags);
  const std::string only = flags.str("op");
  const bool verbose = flags.integer("verbose") != 0;
  const std::vector<GradCase> cases = all_gradcheck_cases();
  std::vector<std::string> order;
  std::map<std::string, GradCheckResult> worst;
  for (const GradCase& c : cases) {
    if (!only.empty() && c.op != only) continue;
    const GradCheckResult r = gradcheck(c);
    if (verbose)
      std::printf("  %s [%s] max_abs=%.3e max_rel=%.3e %s\n", r.op.c_str(), r.variant.c_str(), r.max_abs, r.max_rel,
                  r.pass ? "PASS" : "FAIL");
    auto [it, inserted] = worst.try_emplace(c.op, r);
    if (inserted) {
      order.push_back(c.op);
      continue;
    }
    GradCheckResult& w = it->second;
    w.max_abs = std::max(w.max_abs, r.max_abs);
    w.max_rel = std::max(w.max_rel, r.max_rel);
    w.pass = w.pass && r.pass;
  }
  if (order.empty()) {
    std::vector<std::string> names;
    for (const GradCase& c : cases)
      if (std::find(names.begin(), names.end(), c.op) == names.end()) names.push_back(c.op);
    std::string list;
    for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
    fail("gradcheck: no op named '", only, "'; the ops: ", list);
  }
  int failed = 0;
  for (const std::string& op : order) {
    const GradCheckResult& r = worst[op];
    std::printf("%s max_abs=%.3e max_rel=%.3e %s\n", op.c_str(), r.max_abs, r.max_rel, r.pass ? "PASS" : "FAIL");
    failed += r.pass ? 0 : 1;
  }
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

int cmd_params(const Args& args) {
  const Flags flags("lingtrain params: parameter counts of a model (total and active per token), nothing allocated",
                    {{"model", "tiny", "a preset name or a config.json"}}, args);
  const LingConfig config = resolve_config(flags.str("model"));
  const ParameterCount count = count_parameters(config);
  std::printf("%s\n", Json{{"model", config.name}, {"total", count.total}, {"active", count.active},
                           {"total_billions", count.total / 1e9}, {"active_billions", count.active / 1e9}}
                          .dump()
                          .c_str());
  return 0;
}

int cmd_bench(const Args& args) {
  const Flags flags(
      "lingtrain bench: the training-step speed of one config (last line JSON); without --config: FMA peak, GEMM\n"
      "and each config in its own process",
      {{"config", "", "moe-s, moe-m, dense-124m or any preset (e.g. ling-lite)"},
       threads_flag(),
       {"steps", "10", "measured steps"},
       {"warmup", "3", "warm-up steps before them"},
       {"batch", "0", "with --config: sequences per step (0: the config's bench shape)"},
       {"seq", "0", "with --config: tokens per sequence (0: the config's bench shape)"},
       {"seed", "1", "weights and data seed"},
       {"profile", "0", "1: time per op"},
       {"part", "all", "without --config: kernels, steps or all"},
       {"device", "cpu", "with --config: cpu, cuda or cuda:N"},
       {"dtype", "f32", "with --config: f32, bf16 (on a GPU, or a CPU with AVX512_BF16) or tf32 (a GPU mode: "
                        "plain f32 on a CPU)"}},
      args);
  apply_threads(flags);
  const int64_t steps = flags.positive("steps"), warmup = flags.integer("warmup");
  if (warmup < 0) fail("flag --warmup must be >= 0, got ", warmup);
  const int64_t batch = flags.integer("batch"), seq = flags.integer("seq");
  if (batch < 0 || seq < 0) fail("flags --batch and --seq must be >= 0 (0: the config's bench shape)");
  const bool profile = flags.integer("profile") != 0;
  Json result;
  if (flags.str("config").empty()) {
    if (batch != 0 || seq != 0) fail("bench: --batch and --seq need --config");
    if (flags.str("device") != "cpu" || flags.str("dtype") != "f32")
      fail("bench: --device and --dtype need --config (one config per run)");
    const bench::BenchPart part = bench::parse_bench_part(flags.str("part"));
    result = bench::run_all(part, num_threads(), steps, warmup, profile);
  } else {
    if (flags.was_set("part")) fail("bench: --part applies without --config");
    bench::StepBenchOptions options;
    options.config = flags.str("config");
    options.batch = batch;
    options.seq = seq;
    options.steps = steps;
    options.warmup = warmup;
    options.seed = static_cast<uint64_t>(flags.integer("seed"));
    options.profile = profile;
    options.device = flags.str("device");
    options.matmul_precision = matmul_precision_from_flag(flags.str("dtype"));
    result = bench::run_step_bench(options);
  }
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace lt::cli
