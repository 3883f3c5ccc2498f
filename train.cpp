// lingtrain: the command-line front end. Every stage of training is a subcommand of this one binary;
// the layers below know nothing of flags or output formats.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <sys/ioctl.h>
#include <unistd.h>

#include "bench/bench.h"
#include "data/bpe_tokenizer.h"
#include "data/bpe_trainer.h"
#include "data/chat_template.h"
#include "data/jsonl.h"
#include "data/tool_data.h"
#include "data/shard.h"
#include "data/text_to_shards.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "inspect/report.h"
#include "inspect/routing.h"
#include "inspect/specialisation.h"
#include "inspect/terminal.h"
#include "io/atomic_file.h"
#include "io/input_file.h"
#include "model/gradcheck_cases.h"
#include "model/ling.h"
#include "tensor/cores.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluate.h"
#include "trainer/generate.h"
#include "trainer/tool_eval.h"
#include "trainer/run.h"
#include "trainer/recipe.h"

namespace {

using lt::fail;
using lt::Json;

// Flags of the form --name value or --name=value; every flag a command reads must be declared, so a
// typo is an error instead of a silently ignored option.
class Flags {
 public:
  // switches: flags that mean "1" on their own (--json); repeatable: flags that may be given more than
  // once (every value is kept, in order: list()).
  Flags(std::vector<std::string> args, std::map<std::string, std::string> defaults,
        const std::set<std::string>& switches = {}, const std::set<std::string>& repeatable = {})
      : values_(std::move(defaults)) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& arg = args[i];
      if (arg.rfind("--", 0) != 0) fail("unexpected argument '", arg, "'");
      std::string name = arg.substr(2), value;
      if (const size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (switches.count(name)) {
        value = "1";
      } else {
        if (i + 1 >= args.size()) fail("flag --", name, " needs a value");
        value = args[++i];
      }
      if (!values_.count(name)) fail("unknown flag --", name);
      values_[name] = value;  // the last one wins (make's *_FLAGS override the Makefile's own)
      if (repeatable.count(name)) lists_[name].push_back(value);
      set_.insert(name);
    }
  }
  const std::vector<std::string>& list(const std::string& name) const {
    static const std::vector<std::string> none;
    const auto it = lists_.find(name);
    return it == lists_.end() ? none : it->second;
  }
  bool was_set(const std::string& name) const { return set_.count(name) > 0; }
  const std::string& str(const std::string& name) const { return values_.at(name); }
  void set_default(const std::string& name, const std::string& value) {
    if (!was_set(name)) values_[name] = value;
  }
  long long integer(const std::string& name) const {
    const std::string& v = str(name);
    char* end = nullptr;
    errno = 0;
    const long long parsed = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') fail("flag --", name, " needs an integer, got '", v, "'");
    if (errno == ERANGE) fail("flag --", name, " is out of range: '", v, "'");
    return parsed;
  }
  long long positive(const std::string& name) const {
    const long long v = integer(name);
    if (v <= 0) fail("flag --", name, " must be > 0, got ", v);
    return v;
  }
  double number(const std::string& name) const {
    const std::string& v = str(name);
    char* end = nullptr;
    const double parsed = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(parsed)) fail("flag --", name, " needs a number, got '", v, "'");
    return parsed;
  }
  const std::map<std::string, std::string>& all() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> lists_;
  std::set<std::string> set_;
};

// --dtype: f32, or bf16 (mixed precision: the matmuls take bf16 operands on a GPU or a CPU with
// AVX512_BF16, everything else f32).
lt::kernels::MatmulPrecision matmul_precision_from_flag(const std::string& dtype) {
  if (dtype == "f32") return lt::kernels::MatmulPrecision::F32;
  if (dtype == "bf16") return lt::kernels::MatmulPrecision::BF16Inputs;
  fail("flag --dtype must be f32 or bf16, got '", dtype, "'");
}

// --threads 0 (the default): one thread per core this process may use, shared with the other processes
// an MPI launcher started on this machine.
void apply_threads(const Flags& flags) {
  const long long threads = flags.integer("threads");
  if (threads < 0) fail("flag --threads must be >= 0, got ", threads);
  lt::set_num_threads(threads > 0 ? static_cast<int>(threads) : lt::default_threads(lt::processes_on_this_machine()));
}

int cmd_version(const std::vector<std::string>& args) {
  Flags flags(args, {{"threads", "0"}});
  apply_threads(flags);
  std::printf("lingtrain %s\n", LINGTRAIN_VERSION);
  const char* bf16_unit = lt::kernels::cpu_bf16_matmul_unit();
  std::printf("cpu kernels: Highway %s, %s%s%s, L2 %lld KiB per core\n", lt::cpu_kernel_target(),
              bf16_unit ? "bf16 GEMM (" : "no bf16 GEMM (f32 under --dtype bf16)", bf16_unit ? bf16_unit : "",
              bf16_unit ? ")" : "", static_cast<long long>(lt::cpu_l2_cache_bytes() >> 10));
  std::printf("threads: %d; this machine gives this process %s\n", lt::num_threads(),
              lt::describe_core_facts(lt::read_core_facts()).c_str());
  if (lt::cuda_compiled()) std::printf("cuda: compiled in, %d device(s) found\n%s", lt::cuda_device_count(),
                                      lt::cuda_device_list().c_str());
  else std::printf("cuda: not compiled in\n");
  return 0;
}

// Runs every gradient check and prints one line per op (the worst case of its variants).
int cmd_gradcheck(const std::vector<std::string>& args) {
  Flags flags(args, {{"threads", "0"}, {"op", ""}, {"verbose", "0"}});
  apply_threads(flags);
  const std::string only = flags.str("op");
  const bool verbose = flags.integer("verbose") != 0;
  std::vector<std::string> order;
  std::map<std::string, lt::GradCheckResult> worst;
  for (const lt::GradCase& c : lt::all_gradcheck_cases()) {
    if (!only.empty() && c.op != only) continue;
    const lt::GradCheckResult r = lt::gradcheck(c);
    if (verbose)
      std::printf("  %s [%s] max_abs=%.3e max_rel=%.3e %s\n", r.op.c_str(), r.variant.c_str(), r.max_abs, r.max_rel,
                  r.pass ? "PASS" : "FAIL");
    auto [it, inserted] = worst.try_emplace(c.op, r);
    if (inserted) {
      order.push_back(c.op);
      continue;
    }
    lt::GradCheckResult& w = it->second;
    w.max_abs = std::max(w.max_abs, r.max_abs);
    w.max_rel = std::max(w.max_rel, r.max_rel);
    w.pass = w.pass && r.pass;
  }
  if (order.empty()) fail("gradcheck: no op named '", only, "'");
  int failed = 0;
  for (const std::string& op : order) {
    const lt::GradCheckResult& r = worst[op];
    std::printf("%s max_abs=%.3e max_rel=%.3e %s\n", op.c_str(), r.max_abs, r.max_rel, r.pass ? "PASS" : "FAIL");
    failed += r.pass ? 0 : 1;
  }
  std::fflush(stdout);
  return failed == 0 ? 0 : 1;
}

// ---- pretrain ---------------------------------------------------------------------------------

// The flags that set one stage of a recipe: the recipe's stage keys with dashes ("--warmup-steps" is
// "warmup_steps"). Without --recipe they make a one-stage recipe; with --resume they change the stage
// being resumed (e.g. --steps to train on).
const std::vector<std::string> kStageFlags = {
    "steps", "batch", "seq", "accum", "lr", "min-lr", "lr-schedule", "warmup-steps", "halve-at", "batch-warmup-start",
    "batch-warmup-steps", "clip", "weight-decay", "data", "val", "rope-theta"};
const std::set<std::string> kTextStageKeys = {"data", "val", "lr_schedule"};

std::string key_of(std::string flag) {
  std::replace(flag.begin(), flag.end(), '-', '_');
  return flag;
}

// The stage keys set on the command line, typed as the recipe reads them.
Json stage_from_flags(const Flags& flags) {
  Json stage = Json::object();
  for (const std::string& flag : kStageFlags) {
    if (!flags.was_set(flag)) continue;
    const std::string key = key_of(flag);
    if (kTextStageKeys.count(key)) stage[key] = flags.str(flag);
    else if (key == "lr" || key == "min_lr" || key == "halve_at" || key == "clip" || key == "weight_decay" ||
             key == "rope_theta")
      stage[key] = flags.number(flag);
    else
      stage[key] = flags.integer(flag);
  }
  return stage;
}

// --straggle RANK:FACTOR
void parse_straggle(const std::string& value, lt::RunOptions& options) {
  const size_t colon = value.find(':');
  char* end = nullptr;
  const long rank = colon == std::string::npos ? -1 : std::strtol(value.c_str(), &end, 10);
  const bool rank_ok = colon != std::string::npos && end == value.c_str() + colon && rank >= 0;
  const double factor = rank_ok ? std::strtod(value.c_str() + colon + 1, &end) : 0;
  if (!rank_ok || *end != '\0' || !(factor >= 1)) fail("flag --straggle needs RANK:FACTOR with FACTOR >= 1, got '", value, "'");
  options.straggle_rank = static_cast<int>(rank);
  options.straggle_factor = factor;
}

// The EDiT / A-EDiT flags (dist/edit.h) with the reference implementation's defaults, and the key of
// each in EditSettings::to_json (what a checkpoint records).
struct EditFlag {
  const char* default_value;
  const char* settings_key;
};
const std::map<std::string, EditFlag> kEditFlags = {
    {"shard-group", {"1", "shard_group"}},
    {"local-sgd-warmup", {"0", "local_sgd_warmup"}},
    {"sync-interval", {"1", "sync_interval"}},
    {"sync-seconds", {"600", "sync_seconds"}},
    {"min-total-steps", {"100", "min_total_steps"}},
    {"step-weight", {"off", "step_weight"}},
    {"step-weight-ratio", {"0.5", "step_weight_ratio"}},
    {"weight-by-norm", {"off", "weight_by_norm"}},
    {"weight-temperature", {"1", "temperature"}},
    {"skip-anomaly", {"off", "skip_anomaly"}},
    {"ewma-alpha", {"0.02", "ewma_alpha"}},
    {"ewma-warmup", {"120", "ewma_warmup_steps"}},
    {"ewma-threshold", {"3", "ewma_threshold"}},
    {"clip-pseudo-grad", {"0", "clip_pseudo_grad"}},
    {"outer-optimizer", {"average", "outer_optimizer"}},
    {"outer-lr", {"0.7", "outer_lr"}},
    {"outer-momentum", {"0.8", "outer_momentum"}},
    {"outer-nesterov", {"on", "outer_nesterov"}}};

bool on_off(const Flags& flags, const std::string& name) {
  const std::string& v = flags.str(name);
  if (v != "on" && v != "off") fail("flag --", name, " needs on or off, got '", v, "'");
  return v == "on";
}

// dist: the command line's --dist ("" when a resume leaves it to its checkpoint: the flags are then
// checked against the checkpoint's settings instead).
lt::EditSettings edit_from_flags(const Flags& flags, const std::string& dist) {
  if (dist == "dp")
    for (const auto& [flag, value] : kEditFlags)
      if (flags.was_set(flag)) fail("flag --", flag, " belongs to --dist edit or aedit");
  if (!dist.empty() && dist != "aedit")
    for (const char* flag : {"sync-seconds", "min-total-steps", "step-weight", "step-weight-ratio"})
      if (flags.was_set(flag)) fail("flag --", flag, " belongs to --dist aedit (time-based sync)");
  if (dist == "aedit" && flags.was_set("sync-interval")) fail("flag --sync-interval belongs to --dist edit; aedit syncs by time (--sync-seconds)");
  lt::EditSettings e;
  e.shard_group = static_cast<int>(flags.positive("shard-group"));
  e.local_sgd_warmup = flags.integer("local-sgd-warmup");
  e.sync_interval = flags.positive("sync-interval");
  e.sync_seconds = flags.number("sync-seconds");
  if (!(e.sync_seconds > 0)) fail("flag --sync-seconds must be > 0, got ", e.sync_seconds);
  e.min_total_steps = flags.integer("min-total-steps");
  e.step_weight = on_off(flags, "step-weight");
  e.step_weight_ratio = flags.number("step-weight-ratio");
  e.weight_by_norm = on_off(flags, "weight-by-norm");
  e.temperature = flags.number("weight-temperature");
  e.skip_anomaly = on_off(flags, "skip-anomaly");
  e.detector.alpha = flags.number("ewma-alpha");
  e.detector.warmup_steps = flags.integer("ewma-warmup");
  e.detector.threshold = flags.number("ewma-threshold");
  e.clip_pseudo_grad = flags.number("clip-pseudo-grad");
  const std::string outer = flags.str("outer-optimizer");
  if (outer != "average" && outer != "sgd") fail("flag --outer-optimizer needs average or sgd, got '", outer, "'");
  e.outer_sgd = outer == "sgd";
  if (!e.outer_sgd)
    for (const char* flag : {"outer-lr", "outer-momentum", "outer-nesterov"})
      if (flags.was_set(flag)) fail("flag --", flag, " belongs to --outer-optimizer sgd");
  e.outer.lr = flags.number("outer-lr");
  e.outer.momentum = flags.number("outer-momentum");
  e.outer.nesterov = on_off(flags, "outer-nesterov");
  if (!(e.outer.lr > 0) || e.outer.momentum < 0 || e.outer.momentum >= 1)
    fail("the outer optimizer needs --outer-lr > 0 and 0 <= --outer-momentum < 1");
  return e;
}

// The spike guard's flags (optim/spike_guard.h) with its defaults.
const std::map<std::string, std::string> kSpikeFlags = {
    {"spike-guard", "on"},    {"spike-threshold", "6"}, {"spike-warmup", "50"},     {"spike-alpha", "0.02"},
    {"spike-retries", "3"},   {"spike-lr-cut", "0.5"},  {"spike-cut-after", "2"},   {"spike-cooldown", "200"},
    {"nan-reload-after", "3"}, {"max-reloads", "3"},     {"inject", ""}};

lt::SpikeGuardSettings spike_guard_from_flags(const Flags& flags) {
  lt::SpikeGuardSettings g;
  g.enabled = on_off(flags, "spike-guard");
  g.detector.threshold = flags.number("spike-threshold");
  g.detector.warmup_steps = flags.integer("spike-warmup");
  g.detector.alpha = flags.number("spike-alpha");
  g.max_retries = flags.integer("spike-retries");
  g.lr_cut = flags.number("spike-lr-cut");
  g.spikes_to_cut = flags.integer("spike-cut-after");
  g.cooldown_steps = flags.integer("spike-cooldown");
  g.bad_steps_to_reload = flags.integer("nan-reload-after");
  g.max_reloads = flags.integer("max-reloads");
  g.validate();
  return g;
}

// --inject spike@STEP:FACTOR | nan@STEP[:COUNT], comma-separated (for tests of the guard).
std::vector<lt::Injection> injections_from_flag(const std::string& value) {
  std::vector<lt::Injection> out;
  std::stringstream list(value);
  std::string item;
  while (std::getline(list, item, ',')) {
    lt::Injection injection;
    const size_t at = item.find('@'), colon = item.find(':');
    injection.kind = item.substr(0, at);
    char* end = nullptr;
    const std::string step = at == std::string::npos ? "" : item.substr(at + 1, colon == std::string::npos ? std::string::npos : colon - at - 1);
    injection.step = std::strtoll(step.c_str(), &end, 10);
    bool ok = (injection.kind == "spike" || injection.kind == "nan") && !step.empty() && *end == '\0' && injection.step >= 0;
    const std::string argument = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (injection.kind == "spike") {
      injection.factor = std::strtod(argument.c_str(), &end);
      ok = ok && !argument.empty() && *end == '\0' && std::isfinite(injection.factor);
    } else if (!argument.empty()) {
      injection.count = std::strtoll(argument.c_str(), &end, 10);
      ok = ok && *end == '\0' && injection.count >= 1;
    }
    if (!ok) fail("flag --inject needs spike@STEP:FACTOR or nan@STEP[:COUNT], got '", item, "'");
    out.push_back(injection);
  }
  return out;
}

// The stage keys a post-training command starts from (its flags override them): rows long enough for
// the embedded tool conversations in bytes, a short warmup and a cosine decay to a tenth.
Json post_training_stage_defaults(const std::string& kind) {
  if (kind == "sft")
    return {{"name", "sft"}, {"kind", "sft"}, {"seq", 512}, {"batch", 8}, {"lr", 1e-3}, {"min_lr", 1e-4},
            {"warmup_steps", 10}, {"lr_schedule", "cosine"}, {"weight_decay", 0.0}};
  return {{"name", "dpo"}, {"kind", "dpo"}, {"seq", 1024}, {"batch", 4}, {"lr", 2e-4}, {"min_lr", 2e-5},
          {"warmup_steps", 5}, {"lr_schedule", "cosine"}, {"weight_decay", 0.0}};
}

// A resume runs its checkpoint's recipe: the stage flags given change the resumed stage, and the recipe
// flags given must name what the checkpoint holds (the run's own command line plus --resume works, as
// a preemptible job's script gives it).
void resume_from_flags(const Flags& flags, bool post_training, Json& stage, lt::Recipe& recipe, lt::RunOptions& options) {
  Json named = Json::object();
  if (!post_training && flags.was_set("recipe")) {
    recipe = lt::resolve_recipe(flags.str("recipe"));
    named["recipe"] = flags.str("recipe");
  }
  if (!post_training && flags.was_set("model")) named["model"] = flags.str("model");
  if (flags.was_set("seed")) named["seed"] = flags.integer("seed");
  if (!post_training && flags.was_set("routing-warmup")) named["routing_warmup"] = flags.integer("routing-warmup");
  if (post_training && flags.was_set("ckpt")) named["init"] = flags.str("ckpt");
  if (post_training && flags.was_set("epochs")) stage["epochs"] = flags.number("epochs");
  options.named_recipe_keys = named;
  options.stage_overrides = stage;
}

// pretrain, sft and dpo: one run of the trainer (trainer/run.h) over a recipe; sft and dpo build a
// one-stage recipe of their kind that starts from --ckpt.
int run_command(const std::vector<std::string>& args, const std::string& kind) {
  const bool post_training = kind != "pretrain";
  std::map<std::string, std::string> defaults = {
      {"recipe", ""},        {"model", "tiny"},     {"seed", "1"},         {"routing-warmup", "50"},
      {"out", "out/tiny"},   {"threads", "0"},      {"resume", ""},        {"eval-every", "200"},
      {"eval-tokens", "65536"}, {"ckpt-every", "200"}, {"metrics", ""},    {"sample-prompt", "The "},
      {"sample-tokens", "200"}, {"time-limit", "0"},      {"stop-at", "0"},
      {"dist", "dp"},           {"straggle", ""},         {"tokenizer", ""},       {"device", "cpu"},
      {"dtype", "f32"}, {"save-dtype", "f32"}};
  if (post_training) {
    for (const char* flag : {"recipe", "model", "routing-warmup"}) defaults.erase(flag);
    defaults.insert({{"ckpt", ""}, {"epochs", kind == "sft" ? "2" : "1"}, {"aux-loss-coef", ""}, {"z-loss-coef", ""}});
    if (kind == "dpo") defaults.insert({{"beta", "0.1"}, {"rpo-alpha", "0.05"}});
    defaults["out"] = "out/" + kind;
    defaults["eval-every"] = "50";
    defaults["ckpt-every"] = "100";
    defaults["sample-prompt"] = "";
  }
  for (const std::string& flag : kStageFlags) defaults[flag] = "";
  for (const auto& [flag, edit_flag] : kEditFlags) defaults[flag] = edit_flag.default_value;
  defaults.insert(kSpikeFlags.begin(), kSpikeFlags.end());
  const Flags flags(args, defaults);
  apply_threads(flags);
  Json stage = stage_from_flags(flags);
  lt::RunOptions options;
  options.device = lt::parse_device(flags.str("device"));
  options.matmul_precision = matmul_precision_from_flag(flags.str("dtype"));
  if (flags.str("save-dtype") != "f32" && flags.str("save-dtype") != "bf16")
    fail("flag --save-dtype must be f32 or bf16, got '", flags.str("save-dtype"), "'");
  options.save_dtype = flags.str("save-dtype") == "bf16" ? lt::DType::BF16 : lt::DType::F32;
  options.resume = flags.str("resume");
  options.tokenizer = flags.str("tokenizer");
  if (post_training) {
    for (const char* flag : {"aux-loss-coef", "z-loss-coef"})
      if (flags.was_set(flag)) stage[key_of(flag)] = flags.number(flag);
    if (kind == "dpo")
      for (const char* flag : {"beta", "rpo-alpha"})
        if (flags.was_set(flag)) stage[key_of(flag)] = flags.number(flag);
  }
  lt::Recipe recipe;
  if (!options.resume.empty()) {
    resume_from_flags(flags, post_training, stage, recipe, options);
  } else if (post_training) {
    if (flags.str("ckpt").empty()) fail("flag --ckpt is required: the checkpoint ", kind, " starts from");
    if (!flags.was_set("data")) fail("flag --data is required: a JSONL file of ", kind == "sft" ? "conversations" : "preference pairs");
    Json full = post_training_stage_defaults(kind);
    for (const auto& [key, value] : stage.items()) full[key] = value;
    if (!flags.was_set("steps")) {
      const double epochs = flags.number("epochs");
      if (!(epochs > 0)) fail("flag --epochs must be > 0, got ", flags.str("epochs"));
      full["epochs"] = epochs;
      full["steps"] = 0;  // sized from the epochs once the data is packed (trainer/run.cpp)
    } else if (flags.was_set("epochs")) {
      fail("flags --steps and --epochs both size the run: give one");
    }
    if (kind == "dpo") full["reference"] = flags.str("ckpt");
    recipe = lt::Recipe::from_json({{"model", flags.str("ckpt")}, {"init", flags.str("ckpt")}, {"routing_warmup", 0},
                                    {"stages", Json::array({full})}},
                                   "the command line");
    recipe.seed = static_cast<uint64_t>(flags.integer("seed"));
  } else if (!flags.str("recipe").empty()) {
    if (!stage.empty()) fail("flag --", stage.begin().key(), " sets a one-stage run: with --recipe, set it in the recipe");
    recipe = lt::resolve_recipe(flags.str("recipe"));
  } else {
    recipe = lt::Recipe::from_json({{"stages", Json::array({stage})}}, "the command line");
  }
  if (options.resume.empty() && !post_training) {
    if (flags.was_set("model") || flags.str("recipe").empty()) recipe.model = flags.str("model");
    if (flags.was_set("seed") || flags.str("recipe").empty()) recipe.seed = static_cast<uint64_t>(flags.integer("seed"));
    if (flags.was_set("routing-warmup") || flags.str("recipe").empty())
      recipe.routing_warmup = flags.integer("routing-warmup");
    if (recipe.routing_warmup < 0) fail("flag --routing-warmup must be >= 0, got ", recipe.routing_warmup);
  }
  options.out_dir = flags.str("out");
  // A resume writes next to the checkpoint it continues unless told otherwise, never into the default
  // folder (which may hold another run).
  if (!options.resume.empty() && !flags.was_set("out")) {
    const std::filesystem::path checkpoint = std::filesystem::path(options.resume).lexically_normal();
    options.out_dir = (checkpoint.has_filename() ? checkpoint : checkpoint.parent_path()).parent_path().string();
    if (options.out_dir.empty()) options.out_dir = ".";
  }
  options.eval_every = flags.integer("eval-every");
  options.eval_tokens = flags.integer("eval-tokens");
  options.ckpt_every = flags.integer("ckpt-every");
  options.metrics_path = flags.str("metrics");
  options.sample_prompt = flags.str("sample-prompt");
  options.sample_tokens = flags.positive("sample-tokens");
  options.time_limit_seconds = flags.number("time-limit");
  options.stop_at_step = flags.integer("stop-at");
  options.dist = lt::parse_dist_mode(flags.str("dist"));
  const bool dist_from_checkpoint = !options.resume.empty() && !flags.was_set("dist");
  options.edit = edit_from_flags(flags, dist_from_checkpoint ? "" : flags.str("dist"));
  if (flags.was_set("dist")) options.named_dist_settings["mode"] = flags.str("dist");
  const Json edit_json = options.edit.to_json();
  for (const auto& [flag, edit_flag] : kEditFlags)
    if (flags.was_set(flag)) options.named_dist_settings[edit_flag.settings_key] = edit_json.at(edit_flag.settings_key);
  options.spike_guard = spike_guard_from_flags(flags);
  if (!flags.str("inject").empty()) options.injections = injections_from_flag(flags.str("inject"));
  if (!flags.str("straggle").empty()) parse_straggle(flags.str("straggle"), options);
  Json summary = lt::run_training(recipe, options);
  if (summary.is_null()) return 0;  // a rank other than 0 of a multi-process run: rank 0 reports
  if (summary.contains("sample")) {
    std::printf("sample: %s%s\n", options.sample_prompt.c_str(), summary["sample"].get<std::string>().c_str());
    summary.erase("sample");
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

int cmd_pretrain(const std::vector<std::string>& args) { return run_command(args, "pretrain"); }
int cmd_sft(const std::vector<std::string>& args) { return run_command(args, "sft"); }
int cmd_dpo(const std::vector<std::string>& args) { return run_command(args, "dpo"); }

// ---- eval, sample, shards, params --------------------------------------------------------------

int cmd_eval(const std::vector<std::string>& args) {
  Flags flags(args, {{"ckpt", ""}, {"data", ""}, {"seq", "0"}, {"batch", "8"}, {"threads", "0"}, {"device", "cpu"}});
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("eval needs --ckpt DIR and --data FILE.bin");
  const std::string ckpt = flags.str("ckpt");
  const lt::Device device = lt::parse_device(flags.str("device"));
  lt::LingForCausalLM model(lt::load_checkpoint_config(ckpt), 0);
  lt::load_checkpoint_weights(ckpt, model);
  model.to(device);
  int64_t T = flags.integer("seq");
  if (T <= 0) {
    const Json state = lt::load_trainer_state(ckpt);
    LT_CHECK(state.contains("seq_len"), ckpt, ": trainer_state.json has no seq_len; pass --seq");
    T = state.at("seq_len").get<int64_t>();
  }
  LT_CHECK(T <= model.config().max_position_embeddings, "flag --seq ", T, " exceeds max_position_embeddings ",
           model.config().max_position_embeddings, " of ", ckpt);
  const lt::Tensor tokens = lt::read_token_shard_tensor(flags.str("data"), model.config().vocab_size);
  LT_CHECK(tokens.numel() >= 2, flags.str("data"), ": fewer than 2 tokens, nothing to predict");
  const lt::LossSum loss = lt::evaluate(model, tokens, T, flags.positive("batch"));
  LT_CHECK(std::isfinite(loss.mean()), ckpt, ": the loss is not finite (weights of a diverged run?)");
  std::printf("%s\n", Json{{"loss", loss.mean()}, {"tokens", loss.tokens}, {"seq", T}}.dump().c_str());
  return 0;
}

int cmd_sample(const std::vector<std::string>& args) {
  Flags flags(args, {{"ckpt", ""},    {"prompt", ""},    {"tokens", "200"}, {"temperature", "0.8"}, {"top-k", "40"},
                     {"top-p", "0.95"}, {"seed", "1"},     {"threads", "0"},  {"tokenizer", ""}, {"device", "cpu"}});
  apply_threads(flags);
  if (flags.str("ckpt").empty()) fail("sample needs --ckpt DIR");
  const std::string ckpt = flags.str("ckpt");
  const lt::Device device = lt::parse_device(flags.str("device"));
  lt::LingForCausalLM model(lt::load_checkpoint_config(ckpt), 0);
  lt::load_checkpoint_weights(ckpt, model);
  model.to(device);
  lt::SamplingSettings sampling;
  sampling.max_new_tokens = flags.positive("tokens");
  sampling.temperature = flags.number("temperature");
  sampling.top_k = flags.integer("top-k");
  sampling.top_p = flags.number("top-p");
  sampling.seed = static_cast<uint64_t>(flags.integer("seed"));
  const std::unique_ptr<lt::Tokenizer> tokenizer =
      lt::resolve_tokenizer(flags.str("tokenizer"), ckpt, model.config().vocab_size);
  std::printf("%s%s\n", flags.str("prompt").c_str(),
              lt::sample_text(model, *tokenizer, flags.str("prompt"), sampling).c_str());
  return 0;
}

// Splits "--flag value" pairs from the positional arguments (files, texts) between and after them.
struct FlagsAndPositionals {
  std::vector<std::string> flags, positionals;
};
FlagsAndPositionals split_positionals(const std::vector<std::string>& args) {
  FlagsAndPositionals out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind("--", 0) == 0) {
      out.flags.push_back(args[i]);
      if (args[i].find('=') == std::string::npos && i + 1 < args.size()) out.flags.push_back(args[++i]);
    } else {
      out.positionals.push_back(args[i]);
    }
  }
  return out;
}

int cmd_shards(const std::vector<std::string>& args) {
  // lingtrain shards --out PREFIX [--tokenizer tokenizer.json] FILE... (files after the flags)
  const FlagsAndPositionals split = split_positionals(args);
  const std::vector<std::string>& files = split.positionals;
  Flags flags(split.flags,
              {{"out", ""}, {"tokenizer", ""}, {"tokens-per-shard", std::to_string(lt::kDefaultTokensPerShard)}});
  if (flags.str("out").empty() || files.empty()) fail("shards needs --out PREFIX and at least one text file");
  const std::unique_ptr<lt::Tokenizer> tokenizer = lt::load_tokenizer(flags.str("tokenizer"));
  const lt::ShardsWritten written =
      lt::text_files_to_shards(files, *tokenizer, flags.str("out"), flags.positive("tokens-per-shard"));
  for (const std::string& path : written.paths) std::printf("%s\n", path.c_str());
  std::printf("%s\n", Json{{"documents", written.documents}, {"tokens", written.tokens}}.dump().c_str());
  return 0;
}

// lingtrain tokenizer train --vocab N --out tokenizer.json [--pattern ling|llama3|gpt2] TEXT...
// lingtrain tokenizer encode [--tokenizer T] [--special 1] TEXT...   one JSON line per text
int cmd_tokenizer(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "train" && args[0] != "encode"))
    fail("tokenizer needs a subcommand: train or encode");
  const FlagsAndPositionals split = split_positionals({args.begin() + 1, args.end()});
  if (args[0] == "train") {
    Flags flags(split.flags, {{"vocab", "4096"}, {"out", ""}, {"pattern", "ling"}});
    if (flags.str("out").empty() || split.positionals.empty())
      fail("tokenizer train needs --out tokenizer.json and at least one text file");
    lt::BpeTrainSettings settings;
    settings.vocab_size = flags.positive("vocab");
    settings.pattern = flags.str("pattern");
    std::vector<std::string> texts;
    for (const std::string& path : split.positionals) texts.push_back(lt::read_file(path));
    const Json tokenizer = lt::train_bpe({texts.begin(), texts.end()}, settings);
    lt::write_json_file(flags.str("out"), tokenizer);
    std::printf("%s\n", Json{{"tokenizer", flags.str("out")},
                              {"vocab_size", lt::BpeTokenizer::from_json(tokenizer, flags.str("out")).vocab_size()},
                              {"merges", tokenizer.at("model").at("merges").size()}}
                             .dump()
                             .c_str());
    return 0;
  }
  Flags flags(split.flags, {{"tokenizer", ""}, {"special", "0"}});
  const std::unique_ptr<lt::Tokenizer> tokenizer = lt::load_tokenizer(flags.str("tokenizer"));
  const bool special = flags.integer("special") != 0;
  for (const std::string& text : split.positionals) {
    const std::vector<uint32_t> ids = special ? tokenizer->encode_with_special_tokens(text) : tokenizer->encode(text);
    std::printf("%s\n", Json{{"text", text}, {"ids", ids}}.dump().c_str());
  }
  return 0;
}

// lingtrain chat-template --data F.jsonl [--tokenizer T] [--generation-prompt 1]: per record, the
// rendered text, its ids and the loss mask, as JSON lines.
int cmd_chat_template(const std::vector<std::string>& args) {
  Flags flags(args, {{"data", ""}, {"tokenizer", ""}, {"generation-prompt", "0"}});
  if (flags.str("data").empty()) fail("chat-template needs --data FILE.jsonl");
  const std::unique_ptr<lt::Tokenizer> tokenizer = lt::load_tokenizer(flags.str("tokenizer"));
  const bool generation_prompt = flags.integer("generation-prompt") != 0;
  lt::for_each_jsonl_record(flags.str("data"), [&](const Json& record, const std::string& where) {
    const lt::RenderedChat chat =
        lt::render_chat(lt::conversation_from_json(record, where), *tokenizer, generation_prompt);
    std::printf("%s\n", Json{{"text", chat.text}, {"ids", chat.ids}, {"loss_mask", chat.loss_mask}}.dump().c_str());
  });
  return 0;
}

// lingtrain score --ckpt C --data F.jsonl [--tokenizer T]: per record, the summed log-probability of the
// tokens chat-template marks in loss_mask (the replies and their end tokens) and their count.
int cmd_score(const std::vector<std::string>& args) {
  Flags flags(args, {{"ckpt", ""}, {"data", ""}, {"tokenizer", ""}, {"threads", "0"}});
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("score needs --ckpt DIR and --data FILE.jsonl");
  const std::string ckpt = flags.str("ckpt");
  lt::LingForCausalLM model(lt::load_checkpoint_config(ckpt), 0);
  lt::load_checkpoint_weights(ckpt, model);
  const std::unique_ptr<lt::Tokenizer> tokenizer =
      lt::resolve_tokenizer(flags.str("tokenizer"), ckpt, model.config().vocab_size);
  lt::for_each_jsonl_record(flags.str("data"), [&](const Json& record, const std::string& where) {
    const lt::RenderedChat chat = lt::render_chat(lt::conversation_from_json(record, where), *tokenizer);
    const lt::SequenceLogprob scored = lt::masked_logprob(model, chat.ids, chat.loss_mask, where);
    std::printf("%s\n", Json{{"logp", scored.logp}, {"tokens", scored.tokens}}.dump().c_str());
  });
  return 0;
}

// lingtrain tool-data --out DIR [--seed S] [--sft N] [--dpo N] [--copy N]: the embedded post-training data.
int cmd_tool_data(const std::vector<std::string>& args) {
  Flags flags(args, {{"out", ""}, {"seed", "1"}, {"sft", "8000"}, {"dpo", "2000"}, {"copy", "20000"}});
  if (flags.str("out").empty()) fail("tool-data needs --out DIR");
  const std::string out = flags.str("out");
  const auto seed = static_cast<uint64_t>(flags.integer("seed"));
  const lt::KnowledgeGraph graph = lt::build_knowledge_graph(seed);
  const lt::ToolDataSet set =
      lt::synthesise_tool_data(graph, seed, flags.positive("sft"), flags.positive("dpo"), flags.positive("copy"));
  std::filesystem::create_directories(out);
  lt::write_json_file(out + "/knowledge_graph.json", graph.to_json());
  const std::pair<const char*, const std::vector<Json>*> files[] = {{"sft_train.jsonl", &set.sft_train},
                                                                     {"sft_val.jsonl", &set.sft_val},
                                                                     {"dpo_train.jsonl", &set.dpo_train},
                                                                     {"dpo_val.jsonl", &set.dpo_val},
                                                                     {"copy_train.jsonl", &set.copy_train},
                                                                     {"copy_val.jsonl", &set.copy_val}};
  Json summary = {{"knowledge_graph", out + "/knowledge_graph.json"}, {"facts", graph.facts.size()}};
  for (const auto& [name, records] : files) {
    lt::write_jsonl_file(out + "/" + name, *records);
    summary[name] = records->size();
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

// lingtrain eval-tools --ckpt C --data held_out.jsonl [--graph knowledge_graph.json] [--tokenizer T]
// [--max-tokens N] [--limit N]: the model plays the tool conversations (trainer/tool_eval.h).
int cmd_eval_tools(const std::vector<std::string>& args) {
  Flags flags(args, {{"ckpt", ""}, {"data", ""}, {"graph", ""}, {"tokenizer", ""}, {"max-tokens", "160"},
                     {"limit", "0"}, {"threads", "0"}});
  apply_threads(flags);
  if (flags.str("ckpt").empty() || flags.str("data").empty()) fail("eval-tools needs --ckpt DIR and --data FILE.jsonl");
  const std::string data = flags.str("data"), ckpt = flags.str("ckpt");
  const std::string graph_path = flags.str("graph").empty()
                                     ? (std::filesystem::path(data).parent_path() / "knowledge_graph.json").string()
                                     : flags.str("graph");
  const int64_t limit = flags.integer("limit");
  if (limit < 0) fail("flag --limit must be >= 0, got ", limit);
  const lt::KnowledgeGraph graph = lt::KnowledgeGraph::from_json(lt::read_json_file(graph_path), graph_path);
  std::vector<std::pair<Json, std::string>> records;
  lt::for_each_jsonl_record(data, [&](const Json& record, const std::string& where) {
    if (limit == 0 || static_cast<int64_t>(records.size()) < limit) records.emplace_back(record, where);
  });
  lt::LingForCausalLM model(lt::load_checkpoint_config(ckpt), 0);
  lt::load_checkpoint_weights(ckpt, model);
  const std::unique_ptr<lt::Tokenizer> tokenizer =
      lt::resolve_tokenizer(flags.str("tokenizer"), ckpt, model.config().vocab_size);
  const lt::ToolEvalResult result =
      lt::evaluate_tool_use(model, *tokenizer, graph, records, flags.positive("max-tokens"));
  std::printf("%s\n", result.to_json().dump().c_str());
  return 0;
}

int cmd_params(const std::vector<std::string>& args) {
  Flags flags(args, {{"model", "tiny"}});
  const lt::LingConfig config = lt::resolve_config(flags.str("model"));
  const lt::ParameterCount count = lt::count_parameters(config);
  std::printf("%s\n", Json{{"model", config.name}, {"total", count.total}, {"active", count.active},
                           {"total_billions", count.total / 1e9}, {"active_billions", count.active / 1e9}}
                          .dump()
                          .c_str());
  return 0;
}

// ---- bench ------------------------------------------------------------------------------------

int cmd_bench(const std::vector<std::string>& args) {
  Flags flags(args, {{"config", ""}, {"threads", "0"}, {"steps", "10"}, {"warmup", "3"}, {"batch", "0"},
                     {"seq", "0"},   {"seed", "1"},    {"profile", "0"}, {"part", "all"}, {"device", "cpu"},
                     {"dtype", "f32"}});
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
    const lt::bench::BenchPart part = lt::bench::parse_bench_part(flags.str("part"));
    result = lt::bench::run_all(part, lt::num_threads(), steps, warmup, profile);
  } else {
    if (flags.was_set("part")) fail("bench: --part applies without --config");
    lt::bench::StepBenchOptions options;
    options.config = flags.str("config");
    options.batch = batch;
    options.seq = seq;
    options.steps = steps;
    options.warmup = warmup;
    options.seed = static_cast<uint64_t>(flags.integer("seed"));
    options.profile = profile;
    options.device = flags.str("device");
    options.matmul_precision = matmul_precision_from_flag(flags.str("dtype"));
    result = lt::bench::run_step_bench(options);
  }
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

// ---- inspect, report ---------------------------------------------------------------------------

// Whether stdout is a terminal (colour, and its width for the tables; 0 when not a terminal).
bool stdout_is_terminal() { return isatty(fileno(stdout)) != 0; }
int terminal_columns() {
  winsize size{};
  if (!stdout_is_terminal() || ioctl(fileno(stdout), TIOCGWINSZ, &size) != 0 || size.ws_col == 0) return 0;
  return size.ws_col;
}

// --domain NAME=FILE: a text file (tokenised by the checkpoint's tokenizer) or an llm.c token shard (.bin).
std::vector<lt::DomainText> domains_from_flags(const std::vector<std::string>& specs, const lt::Tokenizer& tokenizer,
                                               int64_t vocab_size, int64_t tokens_per_domain) {
  std::vector<lt::DomainText> domains;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      fail("flag --domain needs NAME=FILE, got '", spec, "'");
    lt::DomainText d;
    d.name = spec.substr(0, eq);
    const std::string path = spec.substr(eq + 1);
    for (const lt::DomainText& other : domains)
      if (other.name == d.name) fail("flag --domain: domain '", d.name, "' is given twice");
    if (path.size() > 4 && path.substr(path.size() - 4) == ".bin") {
      d.tokens = lt::read_token_shard(path, vocab_size);
    } else {
      d.tokens = tokenizer.encode(lt::read_file(path));
    }
    if (d.tokens.empty()) fail(path, ": no tokens for domain '", d.name, "'");
    if (static_cast<int64_t>(d.tokens.size()) > tokens_per_domain) d.tokens.resize(static_cast<size_t>(tokens_per_domain));
    domains.push_back(std::move(d));
  }
  return domains;
}

int cmd_inspect(const std::vector<std::string>& args) {
  Flags flags(args,
              {{"ckpt", ""}, {"text", ""}, {"data", ""}, {"tokens", "64"}, {"offset", "0"}, {"vs", ""}, {"json", "0"},
               {"by-domain", "0"}, {"domain", ""}, {"domain-tokens", "8192"}, {"seq", "0"}, {"threads", "0"}},
              {"json", "by-domain"}, {"domain"});
  apply_threads(flags);
  const std::string ckpt = flags.str("ckpt");
  if (ckpt.empty()) fail("inspect needs --ckpt DIR");
  const bool by_domain = flags.integer("by-domain") != 0 || !flags.list("domain").empty();
  const bool json = flags.integer("json") != 0;
  if (!by_domain && flags.str("text").empty() == flags.str("data").empty())
    fail("inspect needs one of --text TEXT, --data SHARD.bin or --by-domain");
  if (by_domain && (!flags.str("text").empty() || !flags.str("data").empty() || !flags.str("vs").empty()))
    fail("inspect --by-domain takes no --text, --data or --vs");
  lt::LingForCausalLM model(lt::load_checkpoint_config(ckpt), 0);
  lt::load_checkpoint_weights(ckpt, model);
  const std::unique_ptr<lt::Tokenizer> tokenizer = lt::resolve_tokenizer("", ckpt, model.config().vocab_size);
  const int64_t window = flags.integer("seq") > 0 ? flags.positive("seq") : lt::trained_window(ckpt, model.config());
  LT_CHECK(window <= model.config().max_position_embeddings, "flag --seq ", window, " exceeds max_position_embeddings ",
           model.config().max_position_embeddings, " of ", ckpt);
  LT_CHECK(!model.config().moe_layer_indices().empty(), ckpt, ": the model has no MoE layer, there is no routing to inspect");
  const bool colour = !json && stdout_is_terminal();

  if (by_domain) {
    const int64_t per_domain = flags.positive("domain-tokens");
    const std::vector<lt::DomainText> domains =
        flags.list("domain").empty()
            ? lt::embedded_heldout_domains(*tokenizer, per_domain)
            : domains_from_flags(flags.list("domain"), *tokenizer, model.config().vocab_size, per_domain);
    const std::vector<lt::LayerSpecialisation> layers = lt::expert_specialisation(model, domains, window);
    if (!json)
      std::printf("routing of %zu domains (%s), %lld tokens at most each, by MoE layer\n\n", domains.size(),
                  flags.list("domain").empty() ? "held-out text of the embedded corpus" : "--domain files",
                  static_cast<long long>(per_domain));
    for (const lt::LayerSpecialisation& s : layers) {
      if (json) std::printf("%s\n", lt::specialisation_json(s).dump().c_str());
      else std::printf("%s\n", lt::specialisation_table(s, colour).c_str());
    }
    return 0;
  }

  std::vector<uint32_t> tokens;
  if (!flags.str("text").empty()) {
    tokens = tokenizer->encode(flags.str("text"));
  } else {
    const std::vector<uint32_t> shard = lt::read_token_shard(flags.str("data"), model.config().vocab_size);
    const int64_t offset = flags.integer("offset"), count = flags.positive("tokens");
    if (offset < 0 || offset >= static_cast<int64_t>(shard.size()))
      fail("flag --offset ", offset, " is outside the ", shard.size(), " tokens of ", flags.str("data"));
    tokens.assign(shard.begin() + offset, shard.begin() + std::min<int64_t>(offset + count, static_cast<int64_t>(shard.size())));
  }
  if (tokens.empty()) fail("inspect: the text has no tokens");
  const lt::RoutingTrace trace = lt::trace_routing(model, tokens, window);
  std::vector<double> top1_changed;
  if (!flags.str("vs").empty()) {
    const std::string other_dir = flags.str("vs");
    const lt::LingConfig other_config = lt::load_checkpoint_config(other_dir);
    LT_CHECK(other_config.num_experts == model.config().num_experts &&
                 other_config.moe_layer_indices() == model.config().moe_layer_indices() &&
                 other_config.num_experts_per_tok == model.config().num_experts_per_tok,
             "flag --vs ", other_dir, ": its MoE layers (experts, top-k, which layers) differ from ", ckpt, "'s");
    LT_CHECK(lt::load_checkpoint_tokenizer_json(other_dir) == lt::load_checkpoint_tokenizer_json(ckpt), "flag --vs ",
             other_dir, ": its tokenizer differs from ", ckpt, "'s, so the same text is other tokens");
    lt::LingForCausalLM other(other_config, 0);
    lt::load_checkpoint_weights(other_dir, other);
    const lt::RoutingTrace other_trace = lt::trace_routing(other, tokens, window);
    for (size_t l = 0; l < trace.layers.size(); ++l)
      top1_changed.push_back(lt::top1_changed_fraction(trace.layers[l], other_trace.layers[l]));
  }
  if (json) {
    for (const Json& line : lt::routing_json_lines(trace, *tokenizer, top1_changed)) std::printf("%s\n", line.dump().c_str());
    return 0;
  }
  std::vector<lt::LayerTotals> totals;
  for (const lt::LayerTrace& layer : trace.layers) totals.push_back(lt::layer_totals(layer));
  std::printf("%s\n%s", lt::routing_table(trace, *tokenizer, colour, terminal_columns()).c_str(),
              lt::totals_table(totals, top1_changed, colour).c_str());
  if (!top1_changed.empty()) std::printf("top-1 changed: tokens whose first expert differs in %s\n", flags.str("vs").c_str());
  return 0;
}

int cmd_report(const std::vector<std::string>& args) {
  Flags flags(args, {{"run", ""}, {"out", ""}, {"domain", ""}, {"domain-tokens", "8192"}, {"threads", "0"}}, {},
              {"domain"});
  apply_threads(flags);
  const std::string run = flags.str("run");
  if (run.empty()) fail("report needs --run DIR (a run's output folder: metrics.jsonl and checkpoint/)");
  const std::string out = flags.str("out").empty() ? run + "/report.html" : flags.str("out");
  const int64_t per_domain = flags.positive("domain-tokens");
  std::vector<lt::DomainText> domains;
  if (!flags.list("domain").empty()) {
    const lt::LingConfig config = lt::load_checkpoint_config(run + "/checkpoint");
    const std::unique_ptr<lt::Tokenizer> tokenizer = lt::resolve_tokenizer("", run + "/checkpoint", config.vocab_size);
    domains = domains_from_flags(flags.list("domain"), *tokenizer, config.vocab_size, per_domain);
  }
  const std::string html = lt::training_report_html(lt::load_report_data(run, domains, per_domain));
  lt::write_file_atomic(out, html);
  std::printf("training report written to %s\n", out.c_str());
  return 0;
}

void usage(FILE* out) {
  std::fprintf(out,
               "usage: lingtrain <command> [flags]\n"
               "  --version                      version, CPU kernel target and bf16 GEMM, threads, CUDA\n"
               "  gradcheck [--op NAME] [--verbose 1] [--threads N]\n"
               "                                 finite-difference check of every op's backward\n"
               "  pretrain [--model tiny|small|moe-s|...|config.json] [--data train.bin --val val.bin]\n"
               "           [--out DIR] [--steps N] [--batch B] [--seq T] [--lr X] [--accum N] [--routing-warmup W]\n"
               "           [--lr-schedule cosine (default) | wsd (Ling's: warmup, constant, halved after --halve-at\n"
               "           of the tokens) | inverse_sqrt | constant] [--seed S] [--threads N]\n"
               "           [--rope-theta X] [--resume DIR] [--tokenizer tokenizer.json (kept in checkpoints)]\n"
               "           [--device cpu|cuda|cuda:N (sft and dpo too; under mpirun one GPU per rank, --dist dp)]\n"
               "           [--dtype f32|bf16 (bf16: matmuls take bf16 operands with f32 accumulation on a GPU or\n"
               "           a CPU with AVX512_BF16; weights and checkpoints stay f32)]\n"
               "           [--save-dtype f32|bf16 (the checkpoints' weights)]\n"
               "           ...  pre-train (default: the embedded corpus, tokenised by the run's tokenizer)\n"
               "  pretrain --recipe tiny|R.json [--out DIR]   the stages of a recipe in order (resumable)\n"
               "  mpirun -n N lingtrain pretrain ... [--dist dp|edit|aedit] [--straggle RANK:FACTOR]\n"
               "           several processes: dp (default) averages gradients every step; edit is local SGD with\n"
               "           layer-wise sync [--shard-group S] [--local-sgd-warmup N] [--sync-interval N]\n"
               "           [--outer-optimizer average|sgd --outer-lr X --outer-momentum X --outer-nesterov on|off]\n"
               "           [--clip-pseudo-grad X] [--weight-by-norm on --weight-temperature T] [--skip-anomaly on\n"
               "           --ewma-alpha X --ewma-warmup N --ewma-threshold X]; aedit syncs by time instead\n"
               "           [--sync-seconds X] [--min-total-steps K] [--step-weight on --step-weight-ratio R]\n"
               "  pretrain ... [--spike-guard on|off] [--spike-threshold Z] [--spike-warmup N] [--spike-retries N]\n"
               "           [--spike-lr-cut X --spike-cut-after N --spike-cooldown N] [--nan-reload-after K]\n"
               "           [--max-reloads M]   the loss-spike guard and NaN recovery (docs/reliability.md)\n"
               "  sft --ckpt DIR --data train.jsonl [--val val.jsonl] [--out DIR (out/sft)] [--epochs E (2) | --steps N]\n"
               "      [--seq T (512)] [--batch B (8)] [--lr X (1e-3)] [--aux-loss-coef X] [--z-loss-coef X] ...\n"
               "                                 supervised fine-tuning on TRL-style conversations, assistant\n"
               "                                 tokens only, packed with document masking (docs/post_training.md)\n"
               "  dpo --ckpt DIR --data pairs.jsonl [--val val.jsonl] [--out DIR (out/dpo)] [--beta X (0.1)]\n"
               "      [--rpo-alpha X (0.05)] [--epochs E (1) | --steps N] [--seq T (1024)] [--batch B (4)] ...\n"
               "                                 sigmoid DPO against the --ckpt model (log-probs cached on disk);\n"
               "                                 sft and dpo take pretrain's run flags (--resume, --eval-every,\n"
               "                                 --dist, the spike guard ...)\n"
               "  eval --ckpt DIR --data FILE.bin [--seq T] [--device D]   mean next-token loss over the whole file\n"
               "  sample --ckpt DIR --prompt TEXT [--tokens N] [--temperature X] [--top-k K] [--top-p P] [--device D]\n"
               "         [--tokenizer T (default: the checkpoint's)]\n"
               "  shards --out PREFIX [--tokenizer T] FILE... text files to llm.c token shards (byte tokenizer,\n"
               "                                 or a byte-level BPE tokenizer.json)\n"
               "  tokenizer train --vocab N --out tokenizer.json [--pattern ling|llama3|gpt2] FILE...\n"
               "                                 train a byte-level BPE tokenizer on text files\n"
               "  tokenizer encode [--tokenizer T] [--special 1] TEXT...   ids of each text, JSON lines\n"
               "  chat-template --data F.jsonl [--tokenizer T] [--generation-prompt 1]\n"
               "                                 Ling's chat template: text, ids, loss_mask per record\n"
               "  score --ckpt DIR --data F.jsonl [--tokenizer T]   per record, the summed log-prob of the\n"
               "                                 tokens chat-template trains on (logp, tokens), JSON lines\n"
               "  tool-data --out DIR [--seed S] [--sft N] [--dpo N] [--copy N]   the embedded post-training\n"
               "                                 data: a knowledge graph, tool-use SFT conversations, preference\n"
               "                                 pairs, copy instructions\n"
               "  eval-tools --ckpt DIR --data F.jsonl [--graph knowledge_graph.json] [--limit N]\n"
               "                                 the model plays tool conversations: call exact match, format\n"
               "                                 validity, final-answer accuracy (last line JSON)\n"
               "  inspect --ckpt DIR (--text TEXT | --data SHARD.bin [--tokens N (64)] [--offset I]) [--vs DIR2]\n"
               "          [--json]               per token and MoE layer: chosen experts, gate weights, router\n"
               "                                 entropy and z; per layer: load, imbalance, top-1 changes vs DIR2\n"
               "  inspect --ckpt DIR --by-domain [--domain NAME=FILE ...] [--domain-tokens N (8192)] [--json]\n"
               "                                 domain x expert routing, mutual information, co-activation\n"
               "  report --run DIR [--out FILE (DIR/report.html)] [--domain NAME=FILE ...]\n"
               "                                 the training report: one self-contained HTML page\n"
               "  params [--model NAME|config.json]           parameter counts, nothing allocated\n"
               "  bench [--config moe-s|moe-m|dense-124m] [--threads N] [--steps S] [--warmup W] [--profile 1]\n"
               "        [--device cuda|cuda:N (with --config; e.g. --config ling-lite --batch 1 --seq 2048)]\n"
               "        [--dtype bf16 (with --config: on a GPU, or a CPU with AVX512_BF16)]\n"
               "                                 training-step speed of one config, last line JSON; without\n"
               "                                 --config: FMA peak, GEMM and each config in its own process\n"
               "                                 (--part kernels|steps for one half)\n"
               "environment:\n"
               "  LINGTRAIN_CPU_TARGET=AVX2      cap the CPU kernels at an older Highway target (AVX3, AVX2,\n"
               "                                 SSE4, ...): an older CPU's code path on this one\n"
               "  LINGTRAIN_CPU_AMX=0            bf16 GEMMs without a Xeon's AMX tiles (VDPBF16PS instead)\n");
}

}  // namespace

int main(int argc, char** argv) {
  const std::map<std::string, std::function<int(const std::vector<std::string>&)>> commands = {
      {"--version", cmd_version}, {"version", cmd_version}, {"gradcheck", cmd_gradcheck},
      {"pretrain", cmd_pretrain},  {"sft", cmd_sft},         {"dpo", cmd_dpo},         {"eval", cmd_eval},       {"sample", cmd_sample},
      {"shards", cmd_shards},      {"params", cmd_params},   {"bench", cmd_bench},
      {"tokenizer", cmd_tokenizer}, {"chat-template", cmd_chat_template},
      {"score", cmd_score},        {"tool-data", cmd_tool_data}, {"eval-tools", cmd_eval_tools},
      {"inspect", cmd_inspect},    {"report", cmd_report}};
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "help" || name == "-h") {
    usage(stdout);
    return 0;
  }
  const auto command = commands.find(name);
  if (command == commands.end()) {
    std::fprintf(stderr, "lingtrain: error: unknown command '%s' (try lingtrain --help)\n", name.c_str());
    return 2;
  }
  try {
    lt::cap_cpu_target_from_environment();
    return command->second(std::vector<std::string>(argv + 2, argv + argc));
  } catch (const std::exception& e) {
    // In a multi-process run the line names the rank, and every other rank is ended with it.
    const int rank = lt::process_rank();
    if (rank >= 0) std::fprintf(stderr, "lingtrain: error: rank %d: %s\n", rank, e.what());
    else std::fprintf(stderr, "lingtrain: error: %s\n", e.what());
    std::fflush(stderr);
    lt::abort_all_ranks(1);
    return 1;
  }
}
