// pretrain, sft and dpo: one run of the trainer (trainer/run.h) over a recipe. The stage flags come from
// the table of stage settings (trainer/stage_settings.h); sft and dpo build a one-stage recipe of their
// kind that starts from --ckpt. Also the run's own flags: distribution (EDiT, A-EDiT), the spike guard,
// and the test-only --inject and --straggle.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "tensor/error.h"
#include "trainer/checkpoint.h"
#include "trainer/recipe.h"
#include "trainer/run.h"

namespace lt::cli {
namespace {

std::string flag_of(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

// The stage settings of a command of `kind`, as flags ("--warmup-steps" for "warmup_steps") with the
// defaults that command starts from. Without --recipe they make a one-stage recipe; with --resume they
// change the stage being resumed (e.g. --steps to train on).
std::vector<FlagSpec> stage_flags(StageKind kind) {
  const StageSettings defaults = stage_defaults(kind);
  std::vector<FlagSpec> specs;
  for (const StageKey& k : stage_keys())
    if (k.has(kFlag) && k.applies_to(kind)) specs.push_back({flag_of(k.key), stage_value_text(defaults, k.key), k.help});
  return specs;
}

// The stage keys set on the command line, typed as the recipe reads them.
Json stage_from_flags(const Flags& flags, StageKind kind) {
  Json stage = Json::object();
  for (const StageKey& k : stage_keys()) {
    const std::string flag = flag_of(k.key);
    if (!k.has(kFlag) || !k.applies_to(kind) || !flags.was_set(flag)) continue;
    if (k.type == StageKey::Type::Integer) stage[k.key] = flags.integer(flag);
    else if (k.type == StageKey::Type::Number) stage[k.key] = flags.number(flag);
    else stage[k.key] = flags.str(flag);  // text: the recipe reads and checks it
  }
  return stage;
}

const char* kRoundEndNote = "; under --dist aedit one inside a sync round is done at the round's end";

// The run's own flags (not the stage's), with each command's defaults.
std::vector<FlagSpec> run_flags(StageKind kind) {
  const bool pretrain = kind == StageKind::Pretrain;
  std::vector<FlagSpec> specs;
  if (pretrain)
    specs = {{"recipe", "", "tiny or a recipe JSON file: its stages in order (no stage flags then)"},
             {"model", "tiny", "a preset name (tiny, small, moe-s, ...) or a config.json"},
             {"routing-warmup", "50", "stochastic routing warmup steps, counted over the whole run"}};
  else
    specs = {{"ckpt", "", std::string("the checkpoint ") + stage_kind_name(kind) + " starts from (required)"}};
  const std::vector<FlagSpec> common = {
      {"seed", "1", "weights, routing and data-order seed"},
      {"out", pretrain ? "out/tiny" : std::string("out/") + stage_kind_name(kind),
       "output folder: checkpoint/, metrics.jsonl (a resume: next to its checkpoint)"},
      threads_flag(),
      {"resume", "", "a checkpoint to continue from, with its recipe and --dist settings; stage flags change the "
                      "resumed stage, other flags may name the run's own values again (a change is refused)"},
      {"eval-every", pretrain ? "200" : "50", std::string("held-out figures every N steps (0: at the end)") + kRoundEndNote},
      {"eval-tokens", "65536", "held-out tokens per periodic evaluation (0: all)"},
      {"eval-mc", "", "multiple-choice accuracy as the run trains: a JSONL file (eval-mc's formats) or embedded "
                      "(the task made from the embedded corpus's held-out documents)"},
      {"eval-mc-every", "0", std::string("... every N steps (0: with the held-out figures)") + kRoundEndNote},
      {"eval-mc-items", "500", "... over the first N items (0: all of the file)"},
      {"ckpt-every", pretrain ? "200" : "100", std::string("a checkpoint every N steps (0: at the end)") + kRoundEndNote},
      {"ckpt-async", "on", "on: a checkpoint is copied at the step boundary and written while training goes on; "
                           "off: the run waits for the write"},
      {"keep-checkpoints", "1", "the last K checkpoints stay (the older in OUT/checkpoints/step-N); a diverged run "
                                "that reloads again before its next checkpoint goes back one further"},
      {"keep-every", "0", "the checkpoints of every M-th step also stay, for ever (0: none)"},
      {"metrics", "", "the metrics file (default: OUT/metrics.jsonl)"},
      {"sample-prompt", pretrain ? "The " : "", "the prompt of the sample at the end (empty: no sample)"},
      {"sample-tokens", "200", "tokens of that sample"},
      {"time-limit", "0", "seconds after which the run stops with a checkpoint (0: none)"},
      {"stop-at", "0", "the global step after which the run stops with a checkpoint (0: run to the end)"},
      {"dist", "dp", "under mpirun: dp (gradients averaged every step), edit (local SGD, layer-wise sync) or aedit "
                     "(edit, synced by time); a resume keeps its checkpoint's"},
      {"overlap-grads", "1", "dp under mpirun: 1 averages the gradients in buckets while the backward goes on, 0 "
                             "after it (the same bits)"},
      {"expert-parallel", "1", "under mpirun: split each MoE layer's routed experts over this many consecutive ranks "
                               "(tokens reach their experts by all-to-all); dp: data parallel across those groups; "
                               "edit, aedit: each group is a replica; a resume on as many ranks keeps its "
                               "checkpoint's, on another number 1"},
      {"shard-params", "off", "under mpirun: on: each rank holds 1/N of every layer's values, gradients and AdamW "
                              "state, the layer gathered whole for its forward and its backward (ZeRO-3); with "
                              "--expert-parallel each rank's experts split over their copies; edit, aedit: inside "
                              "each replica, in place of ZeRO-2; a resume on as many ranks keeps its checkpoint's, "
                              "on another number off"},
      {"collective-timeout", "1800", "seconds a collective or a step may last before the run ends on every rank "
                                     "with a line naming the rank (a rank that stopped answering; 0: never)"},
      {"profile-every", "0", "profile one step in N op by op (forward, backward, optimizer), with the thread pool's "
                             "waits and each collective's time and bytes, per rank, into the metrics and the report "
                             "(0: never)"},
      {"slow-rank-factor", "1.5", "under mpirun: a rank this many times slower than the median rank for "
                                   "3 log points in a row is named, with the part of its step that is slow (0: off)"},
      {"straggle", "", "RANK:FACTOR: that rank's steps take FACTOR times as long (to measure uneven hardware)"},
      {"tokenizer", "", "a byte-level BPE tokenizer.json (kept in checkpoints; default: the byte tokenizer)"},
      {"device", "cpu", "cpu, cuda or cuda:N (under mpirun one GPU per rank, --dist dp)"},
      {"dtype", "f32", "f32, bf16 or tf32 (bf16: matmuls take bf16 operands with f32 accumulation on a GPU or a "
                       "CPU with AVX512_BF16; tf32: f32 matmuls on a GPU's tensor cores as TF32, plain f32 on a CPU; "
                       "weights and checkpoints stay f32)"},
      {"save-dtype", "f32", "f32 or bf16: the checkpoints' weights"}};
  specs.insert(specs.end(), common.begin(), common.end());
  return specs;
}

// The EDiT / A-EDiT flags (dist/edit.h). The defaults are the settings of the EDiT README's example
// (sync every 10 steps after a synchronous warmup, Nesterov outer SGD, the pseudo-gradient clipped at 10,
// replicas weighed by their norms, anomalies dropped after 10 syncs), the warmup scaled to the run: on
// the tiny model they end within 0.3% of data parallel's held-out loss, where plain averaging every step
// (the ATorch library's defaults) ends 3% above it and no warmup 21% (docs/distributed.md).
const std::vector<FlagSpec>& edit_flags() {
  static const std::vector<FlagSpec> specs = {
      {"shard-group", "1", "edit, aedit: ranks per replica (ZeRO-2 shards)"},
      {"local-sgd-warmup", "auto", "edit, aedit: steps with gradients averaged across replicas before local steps "
                                   "(auto: a third of the run's steps, at most 100)"},
      {"sync-interval", "10", "edit: a sync every N steps"},
      {"sync-seconds", "600", "aedit: a sync when this many seconds have passed since the last"},
      {"min-total-steps", "100", "aedit: ... unless the replicas took fewer steps together since the last"},
      {"step-weight", "off", "aedit: on mixes each replica's share of the steps into its weight"},
      {"step-weight-ratio", "0.5", "aedit: weight = (1 - r) norm weight + r step weight"},
      {"weight-by-norm", "on", "edit, aedit: on weighs the replicas by softmax(-norm / T) (off: equally)"},
      {"weight-temperature", "1", "edit, aedit: T of that softmax"},
      {"skip-anomaly", "on", "edit, aedit: on drops outlying pseudo-gradients (EWMA detector per layer)"},
      {"ewma-alpha", "0.02", "edit, aedit: that detector's EWMA weight"},
      {"ewma-warmup", "10", "edit, aedit: syncs before that detector judges"},
      {"ewma-threshold", "3", "edit, aedit: that detector's z threshold"},
      {"clip-pseudo-grad", "10", "edit, aedit: the pseudo-gradient norm clip (0: none)"},
      {"outer-optimizer", "sgd", "edit, aedit: sgd (Nesterov, on the anchor) or average (anchor -= pseudo-gradient)"},
      {"outer-lr", "0.7", "outer sgd: learning rate"},
      {"outer-momentum", "0.8", "outer sgd: momentum"},
      {"outer-nesterov", "on", "outer sgd: Nesterov momentum, on or off"}};
  return specs;
}

// The spike guard's flags (optim/spike_guard.h) with its defaults, and the faults tests inject.
const std::vector<FlagSpec>& spike_flags() {
  static const std::vector<FlagSpec> specs = {
      {"spike-guard", "on", "on or off: the loss-spike guard and NaN recovery (docs/reliability.md)"},
      {"spike-threshold", "6", "the z-score of the loss or gradient norm that counts as a spike"},
      {"spike-warmup", "50", "steps before the detectors judge"},
      {"spike-alpha", "0.02", "the detectors' EWMA weight"},
      {"spike-retries", "3", "retries of a spiking step on other data"},
      {"spike-lr-cut", "0.5", "the factor the lr is cut by after --spike-cut-after spikes"},
      {"spike-cut-after", "2", "spikes that cut the lr"},
      {"spike-cooldown", "200", "steps the cut lr lasts"},
      {"nan-reload-after", "3", "non-finite steps in a row that reload the last checkpoint"},
      {"max-reloads", "3", "reloads before the run stops"},
      {"inject", "", "tests: spike@STEP:FACTOR, nan@STEP[:COUNT] or hang@STEP[:RANK] (that rank stops answering), "
                     "comma-separated"}};
  return specs;
}

// --straggle RANK:FACTOR
void parse_straggle(const std::string& value, RunOptions& options) {
  const size_t colon = value.find(':');
  char* end = nullptr;
  const long rank = colon == std::string::npos ? -1 : std::strtol(value.c_str(), &end, 10);
  const bool rank_ok = colon != std::string::npos && end == value.c_str() + colon && rank >= 0;
  const double factor = rank_ok ? std::strtod(value.c_str() + colon + 1, &end) : 0;
  if (!rank_ok || *end != '\0' || !(factor >= 1)) fail("flag --straggle needs RANK:FACTOR with FACTOR >= 1, got '", value, "'");
  options.straggle_rank = static_cast<int>(rank);
  options.straggle_factor = factor;
}

// The synchronous warmup's length that `--local-sgd-warmup auto` gives a run of `run_steps`: the
// example's 100 steps were a third of the run it was measured on, and a shorter run keeps that share.
int64_t auto_local_sgd_warmup(int64_t run_steps) { return std::min<int64_t>(100, run_steps / 3); }

// dist: the command line's --dist, or none when a resume leaves it to its checkpoint (the run then
// checks the EDiT flags given against the checkpoint's settings). run_steps: the recipe's steps.
EditSettings edit_from_flags(const Flags& flags, std::optional<DistMode> dist, int64_t run_steps) {
  if (dist == DistMode::DataParallel)
    for (const FlagSpec& spec : edit_flags())
      if (flags.was_set(spec.name)) fail("flag --", spec.name, " belongs to --dist edit or aedit");
  if (dist && dist != DistMode::AEdit)
    for (const char* flag : {"sync-seconds", "min-total-steps", "step-weight", "step-weight-ratio"})
      if (flags.was_set(flag)) fail("flag --", flag, " belongs to --dist aedit (time-based sync)");
  if (dist == DistMode::AEdit && flags.was_set("sync-interval")) fail("flag --sync-interval belongs to --dist edit; aedit syncs by time (--sync-seconds)");
  EditSettings e;
  e.shard_group = static_cast<int>(flags.positive("shard-group"));
  e.local_sgd_warmup = flags.str("local-sgd-warmup") == "auto" ? auto_local_sgd_warmup(run_steps)
                                                                : flags.integer("local-sgd-warmup");
  e.sync_interval = flags.positive("sync-interval");
  e.sync_seconds = flags.number("sync-seconds");
  if (!(e.sync_seconds > 0)) fail("flag --sync-seconds must be > 0, got ", e.sync_seconds);
  e.min_total_steps = flags.integer("min-total-steps");
  e.step_weight = flags.on_off("step-weight");
  e.step_weight_ratio = flags.number("step-weight-ratio");
  e.weight_by_norm = flags.on_off("weight-by-norm");
  e.temperature = flags.number("weight-temperature");
  e.skip_anomaly = flags.on_off("skip-anomaly");
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
  e.outer.nesterov = flags.on_off("outer-nesterov");
  if (!(e.outer.lr > 0) || e.outer.momentum < 0 || e.outer.momentum >= 1)
    fail("the outer optimizer needs --outer-lr > 0 and 0 <= --outer-momentum < 1");
  return e;
}

SpikeGuardSettings spike_guard_from_flags(const Flags& flags) {
  SpikeGuardSettings g;
  g.enabled = flags.on_off("spike-guard");
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
std::vector<Injection> injections_from_flag(const std::string& value) {
  std::vector<Injection> out;
  std::stringstream list(value);
  std::string item;
  while (std::getline(list, item, ',')) {
    Injection injection;
    const size_t at = item.find('@'), colon = item.find(':');
    const std::string kind = item.substr(0, at);
    injection.kind = kind == "nan"    ? Injection::Kind::Nan
                     : kind == "hang" ? Injection::Kind::Hang
                                      : Injection::Kind::Spike;
    char* end = nullptr;
    const std::string step = at == std::string::npos ? "" : item.substr(at + 1, colon == std::string::npos ? std::string::npos : colon - at - 1);
    injection.step = std::strtoll(step.c_str(), &end, 10);
    bool ok = (kind == "spike" || kind == "nan" || kind == "hang") && !step.empty() && *end == '\0' && injection.step >= 0;
    const std::string argument = colon == std::string::npos ? "" : item.substr(colon + 1);
    if (injection.kind == Injection::Kind::Spike) {
      injection.factor = std::strtod(argument.c_str(), &end);
      ok = ok && !argument.empty() && *end == '\0' && std::isfinite(injection.factor);
    } else if (injection.kind == Injection::Kind::Hang && !argument.empty()) {
      injection.rank = static_cast<int>(std::strtol(argument.c_str(), &end, 10));
      ok = ok && *end == '\0' && injection.rank >= 0;
    } else if (!argument.empty()) {
      injection.count = std::strtoll(argument.c_str(), &end, 10);
      ok = ok && *end == '\0' && injection.count >= 1;
    }
    if (!ok) fail("flag --inject needs spike@STEP:FACTOR, nan@STEP[:COUNT] or hang@STEP[:RANK], got '", item, "'");
    out.push_back(injection);
  }
  return out;
}

// The EDiT settings the command line named, by their EditSettings::to_json keys (the flag's name with
// underscores, but for two), with the values `edit` parsed from them.
Json named_edit_settings(const Flags& flags, const EditSettings& edit) {
  const Json values = edit.to_json();
  Json named = Json::object();
  for (const FlagSpec& spec : edit_flags()) {
    if (!flags.was_set(spec.name)) continue;
    std::string key = spec.name == "weight-temperature" ? "temperature"
                      : spec.name == "ewma-warmup"      ? "ewma_warmup_steps"
                                                        : spec.name;
    std::replace(key.begin(), key.end(), '-', '_');
    named[key] = values.at(key);
  }
  return named;
}

// --resume: the run continues its checkpoint's recipe. The stage flags given change the resumed stage;
// the recipe flags given must name what the checkpoint holds, which the run checks (a preemptible
// job's script gives the run's own command line plus --resume). The run writes next to the checkpoint
// unless told otherwise, never into the default folder (which may hold another run).
void apply_resume(const Flags& flags, const Json& stage, Recipe& recipe, RunOptions& options) {
  Json named = Json::object();
  if (flags.was_set("recipe")) {
    recipe = resolve_recipe(flags.str("recipe"));
    named["recipe"] = flags.str("recipe");
  }
  if (flags.was_set("model")) named["model"] = flags.str("model");
  if (flags.was_set("seed")) named["seed"] = flags.integer("seed");
  if (flags.was_set("routing-warmup")) named["routing_warmup"] = flags.integer("routing-warmup");
  if (flags.was_set("ckpt")) named["init"] = flags.str("ckpt");
  options.named_recipe_keys = named;
  options.stage_overrides = stage;
  if (!flags.was_set("out")) options.out_dir = run_folder_of_checkpoint(options.resume);
}

// sft and dpo: a one-stage recipe of their kind from --ckpt, sized by --steps or --epochs.
Recipe post_training_recipe(const Flags& flags, const Json& stage, StageKind kind) {
  const char* name = stage_kind_name(kind);
  if (flags.str("ckpt").empty()) fail("flag --ckpt is required: the checkpoint ", name, " starts from");
  if (!flags.was_set("data"))
    fail("flag --data is required: a JSONL file of ", kind == StageKind::Sft ? "conversations" : "preference pairs");
  Json full = stage_to_json(stage_defaults(kind));
  for (const auto& [key, value] : stage.items()) full[key] = value;
  if (!flags.was_set("steps")) {
    if (!(full.at("epochs").get<double>() > 0)) fail("flag --epochs must be > 0, got ", flags.str("epochs"));
  } else if (flags.was_set("epochs")) {
    fail("flags --steps and --epochs both size the run: give one");
  } else {
    full["epochs"] = 0;  // the steps are given
  }
  if (kind == StageKind::Dpo) full["reference"] = flags.str("ckpt");
  Recipe recipe = Recipe::from_json({{"model", flags.str("ckpt")}, {"init", flags.str("ckpt")}, {"routing_warmup", 0},
                                     {"stages", Json::array({full})}},
                                    "the command line");
  recipe.seed = static_cast<uint64_t>(flags.integer("seed"));
  return recipe;
}

// pretrain: a recipe (--recipe) or a one-stage recipe of the stage flags, with --model, --seed and
// --routing-warmup.
Recipe pretrain_recipe(const Flags& flags, const Json& stage) {
  Recipe recipe;
  const bool from_file = !flags.str("recipe").empty();
  if (from_file) {
    if (!stage.empty()) fail("flag --", stage.begin().key(), " sets a one-stage run: with --recipe, set it in the recipe");
    recipe = resolve_recipe(flags.str("recipe"));
  } else {
    recipe = Recipe::from_json({{"stages", Json::array({stage})}}, "the command line");
  }
  if (flags.was_set("model") || !from_file) recipe.model = flags.str("model");
  if (flags.was_set("seed") || !from_file) recipe.seed = static_cast<uint64_t>(flags.integer("seed"));
  if (flags.was_set("routing-warmup") || !from_file) recipe.routing_warmup = flags.integer("routing-warmup");
  if (recipe.routing_warmup < 0) fail("flag --routing-warmup must be >= 0, got ", recipe.routing_warmup);
  return recipe;
}

std::string run_usage(StageKind kind) {
  switch (kind) {
    case StageKind::Pretrain:
      return "lingtrain pretrain [flags]: pre-train (default: the embedded corpus, tokenised by the run's tokenizer)\n"
             "lingtrain pretrain --recipe tiny|R.json [--out DIR]: the stages of a recipe in order (resumable)\n"
             "mpirun -n N lingtrain pretrain ... [--dist dp|edit|aedit]: several processes";
    case StageKind::Sft:
      return "lingtrain sft --ckpt DIR --data train.jsonl [flags]: supervised fine-tuning on TRL-style conversations,\n"
             "assistant tokens only, packed with document masking (docs/post_training.md)";
    case StageKind::Dpo:
      return "lingtrain dpo --ckpt DIR --data pairs.jsonl [flags]: sigmoid DPO against the --ckpt model (log-probs\n"
             "cached on disk; docs/post_training.md)";
  }
  return "";
}

int run_command(const Args& args, StageKind kind) {
  const bool post_training = kind != StageKind::Pretrain;
  std::vector<FlagSpec> specs = run_flags(kind);
  for (const std::vector<FlagSpec>& more : {stage_flags(kind), edit_flags(), spike_flags()})
    specs.insert(specs.end(), more.begin(), more.end());
  const Flags flags(run_usage(kind), specs, args);
  apply_threads(flags);
  const Json stage = stage_from_flags(flags, kind);
  RunOptions options;
  options.device = parse_device(flags.str("device"));
  options.matmul_precision = matmul_precision_from_flag(flags.str("dtype"));
  if (flags.str("save-dtype") != "f32" && flags.str("save-dtype") != "bf16")
    fail("flag --save-dtype must be f32 or bf16, got '", flags.str("save-dtype"), "'");
  options.save_dtype = flags.str("save-dtype") == "bf16" ? DType::BF16 : DType::F32;
  options.resume = flags.str("resume");
  options.tokenizer = flags.str("tokenizer");
  options.out_dir = flags.str("out");
  Recipe recipe;
  if (!options.resume.empty()) apply_resume(flags, stage, recipe, options);
  else if (post_training) recipe = post_training_recipe(flags, stage, kind);
  else recipe = pretrain_recipe(flags, stage);
  options.eval_every = flags.integer("eval-every");
  options.eval_tokens = flags.integer("eval-tokens");
  options.eval_mc = flags.str("eval-mc");
  options.eval_mc_every = flags.integer("eval-mc-every");
  options.eval_mc_items = flags.integer("eval-mc-items");
  if (options.eval_mc_every < 0 || options.eval_mc_items < 0)
    fail("flags --eval-mc-every and --eval-mc-items must be >= 0, got ", options.eval_mc_every, " and ",
         options.eval_mc_items);
  options.ckpt_every = flags.integer("ckpt-every");
  options.async_checkpoints = flags.on_off("ckpt-async");
  options.keep_checkpoints = flags.positive("keep-checkpoints");
  options.keep_every = flags.integer("keep-every");
  if (options.keep_every < 0) fail("flag --keep-every must be >= 0, got ", options.keep_every);
  options.metrics_path = flags.str("metrics");
  options.sample_prompt = flags.str("sample-prompt");
  options.sample_tokens = flags.positive("sample-tokens");
  options.time_limit_seconds = flags.number("time-limit");
  options.stop_at_step = flags.integer("stop-at");
  options.dist = parse_dist_mode(flags.str("dist"));
  if (flags.str("overlap-grads") != "0" && flags.str("overlap-grads") != "1")
    fail("flag --overlap-grads must be 0 or 1, got '", flags.str("overlap-grads"), "'");
  options.overlap_grads = flags.str("overlap-grads") == "1";
  const bool dist_from_checkpoint = !options.resume.empty() && !flags.was_set("dist");
  options.edit = edit_from_flags(flags, dist_from_checkpoint ? std::nullopt : std::optional(options.dist),
                                 recipe.total_steps());
  options.named_dist_settings = named_edit_settings(flags, options.edit);
  if (flags.was_set("dist")) options.named_dist_settings["mode"] = flags.str("dist");
  options.expert_parallel = static_cast<int>(flags.positive("expert-parallel"));
  if (flags.was_set("expert-parallel")) options.named_dist_settings["expert_parallel"] = options.expert_parallel;
  options.shard_params = flags.on_off("shard-params");
  if (flags.was_set("shard-params")) options.named_dist_settings["shard_params"] = options.shard_params;
  options.spike_guard = spike_guard_from_flags(flags);
  if (!flags.str("inject").empty()) options.injections = injections_from_flag(flags.str("inject"));
  if (!flags.str("straggle").empty()) parse_straggle(flags.str("straggle"), options);
  options.collective_timeout_seconds = flags.number("collective-timeout");
  options.slow_rank_factor = flags.number("slow-rank-factor");
  options.profile_every = flags.integer("profile-every");
  if (options.profile_every < 0) fail("flag --profile-every must be >= 0, got ", options.profile_every);
  if (!(options.slow_rank_factor == 0 || options.slow_rank_factor > 1))
    fail("flag --slow-rank-factor must be > 1 (or 0: off), got ", flags.str("slow-rank-factor"));
  if (!(options.collective_timeout_seconds >= 0))
    fail("flag --collective-timeout must be >= 0 seconds, got ", flags.str("collective-timeout"));
  Json summary = run_training(recipe, options);
  if (summary.is_null()) return 0;  // a rank other than 0 of a multi-process run: rank 0 reports
  if (summary.contains("sample")) {
    std::printf("sample: %s%s\n", options.sample_prompt.c_str(), summary["sample"].get<std::string>().c_str());
    summary.erase("sample");
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

}  // namespace

int cmd_pretrain(const Args& args) { return run_command(args, StageKind::Pretrain); }
int cmd_sft(const Args& args) { return run_command(args, StageKind::Sft); }
int cmd_dpo(const Args& args) { return run_command(args, StageKind::Dpo); }

}  // namespace lt::cli
