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
#include "trainer/plan.h"

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

// lingtrain plan: a layout's memory per rank and traffic per step (trainer/plan.h), nothing allocated.
int cmd_plan(const Args& args) {
  const Flags flags(
      "lingtrain plan: memory per rank and bytes sent per step of a model in a layout, counted from the shapes\n"
      "(nothing allocated; last line JSON)",
      {{"model", "tiny", "a preset name or a config.json"},
       {"ranks", "1", "processes (mpirun -n)"},
       {"dist", "dp", "dp or edit (edit and aedit share a layout: replicas of --shard-group ranks)"},
       {"shard-group", "1", "edit: ranks per replica (ZeRO-2)"},
       {"sync-interval", "10", "edit: steps between syncs"},
       {"expert-parallel", "1", "ranks that split each MoE layer's routed experts"},
       {"shard-params", "off", "on: each rank keeps 1/D of the values, gradients and AdamW state (ZeRO-3)"},
       {"batch", "1", "sequences per rank and step"},
       {"seq", "2048", "tokens per sequence"},
       {"dtype", "f32", "f32 or bf16"},
       {"device", "cuda", "cpu or cuda (a GPU keeps activations in bf16 under --dtype bf16, with a bf16 weight copy)"},
       {"device-memory", "0", "GiB per device: says whether the peak fits (0: not asked)"}},
      args);
  const LingConfig config = resolve_config(flags.str("model"));
  PlanLayout layout;
  layout.ranks = flags.positive("ranks");
  const std::string dist = flags.str("dist");
  if (dist != "dp" && dist != "edit" && dist != "aedit") fail("flag --dist needs dp, edit or aedit, got '", dist, "'");
  layout.edit = dist != "dp";
  layout.shard_group = flags.positive("shard-group");
  layout.sync_interval = flags.positive("sync-interval");
  layout.expert_parallel = flags.positive("expert-parallel");
  layout.shard_params = flags.on_off("shard-params");
  PlanShape shape;
  shape.batch = flags.positive("batch");
  shape.seq = flags.positive("seq");
  const std::string dtype = flags.str("dtype"), device = flags.str("device");
  if (dtype != "f32" && dtype != "bf16") fail("flag --dtype needs f32 or bf16, got '", dtype, "'");
  if (device != "cpu" && device != "cuda") fail("flag --device needs cpu or cuda, got '", device, "'");
  shape.matmul_dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
  shape.on_gpu = device == "cuda";
  const double device_gib = flags.number("device-memory");
  if (!(device_gib >= 0)) fail("flag --device-memory must be >= 0 GiB, got ", device_gib);
  const Plan plan = plan_training(config, layout, shape);

  const RankMemory& m = plan.memory;
  const StepTraffic& t = plan.traffic;
  auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
  auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  std::printf("%s: %.3fB parameters (%.3fB in routed experts); %lld ranks, %s%s, expert parallel %lld, parameters %s;"
              " %lld x %lld tokens per rank, %s on a %s\n",
              config.name.c_str(), plan.total_params / 1e9, plan.routed_expert_params / 1e9,
              static_cast<long long>(layout.ranks), layout.edit ? "EDiT, replicas of " : "data parallel",
              layout.edit ? (std::to_string(layout.shard_group) + " ranks").c_str() : "",
              static_cast<long long>(layout.expert_parallel), layout.shard_params ? "sharded" : "not sharded",
              static_cast<long long>(shape.batch), static_cast<long long>(shape.seq), dtype.c_str(),
              shape.on_gpu ? "GPU" : "CPU");
  std::printf("per rank: %.3fB parameters\n", m.params / 1e9);
  const std::pair<const char*, int64_t> rows[] = {
      {"weights (f32)", m.weights},   {"gradients (f32)", m.gradients},       {"AdamW state (f32)", m.adamw},
      {"bf16 weight copy", m.bf16_copy}, {"a layer gathered", m.gathered},   {"activations kept", m.activations},
      {"transient (head chunk, gradients)", m.transient}};
  for (const auto& [name, bytes] : rows)
    if (bytes > 0) std::printf("  %-36s %12.2f GiB\n", name, gib(bytes));
  std::printf("  %-36s %12.2f GiB\n  %-36s %12.2f GiB", "held between steps", gib(m.held()), "peak", gib(m.peak()));
  if (device_gib > 0)
    std::printf(" (%s %.0f GiB)", gib(m.peak()) <= device_gib ? "fits" : "does not fit", device_gib);
  std::printf("\nbytes sent per step by one rank:\n");
  const std::pair<const char*, int64_t> sends[] = {
      {layout.edit ? "gradient all-reduce (each warmup step)" : "gradient all-reduce", t.gradient_all_reduce},
      {"parameter all-gather", t.parameter_all_gather},
      {"gradient reduce-scatter", t.gradient_reduce_scatter},
      {"expert all-to-all", t.expert_all_to_all},
      {"EDiT syncs (per step after the warmup)", t.edit_sync},
      {"replicated gradients within a replica", t.replica_all_reduce}};
  for (const auto& [name, bytes] : sends)
    if (bytes > 0) std::printf("  %-40s %12.2f MiB\n", name, mib(bytes));
  Json out = plan.to_json();
  out["model"] = config.name;
  std::printf("%s\n", out.dump().c_str());
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
       {"generate", "0", "with --config: K > 0 measures greedy generation of K prompts, alone and together"},
       {"tokens", "64", "with --generate: new tokens per prompt"},
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
  const int64_t generate_rows = flags.integer("generate");
  if (generate_rows < 0) fail("flag --generate must be >= 0, got ", generate_rows);
  Json result;
  if (flags.str("config").empty()) {
    if (batch != 0 || seq != 0) fail("bench: --batch and --seq need --config");
    if (generate_rows != 0) fail("bench: --generate needs --config");
    if (flags.str("device") != "cpu" || flags.str("dtype") != "f32")
      fail("bench: --device and --dtype need --config (one config per run)");
    const bench::BenchPart part = bench::parse_bench_part(flags.str("part"));
    result = bench::run_all(part, num_threads(), steps, warmup, profile);
  } else if (generate_rows != 0) {
    bench::GenerationBenchOptions options;
    options.config = flags.str("config");
    options.rows = generate_rows;
    options.new_tokens = flags.positive("tokens");
    options.seed = static_cast<uint64_t>(flags.integer("seed"));
    options.device = flags.str("device");
    result = bench::run_generation_bench(options);
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
