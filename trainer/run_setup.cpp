#include "trainer/run_setup.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "data/batch_sampler.h"
#include "data/corpus.h"
#include "data/corpus_multiple_choice.h"
#include "data/shard.h"
#include "dist/expert_exchange.h"
#include "dist/nccl_communicator.h"
#include "io/atomic_file.h"
#include "io/format_text.h"
#include "io/input_file.h"
#include "tensor/derive_seed.h"
#include "tensor/kernels.h"
#include "trainer/checkpoint.h"

namespace lt {

namespace {

// What makes a recipe the same recipe when a resume names it again: its model, seed, routing warmup
// and its stages' names and kinds. Their sizes and rates are not: a resume may change the resumed
// stage's, and the run itself may have fitted them (epochs to steps, a warmup to its stage).
Json recipe_identity(const Json& recipe) {
  Json stages = Json::array();
  for (const Json& stage : recipe.at("stages"))
    stages.push_back({{"name", stage.value("name", Json())},
                      {"kind", stage.value("kind", Json(stage_kind_name(StageKind::Pretrain)))}});
  return {{"model", recipe.value("model", Json())},
          {"seed", recipe.value("seed", Json())},
          {"routing_warmup", recipe.value("routing_warmup", Json())},
          {"stages", stages}};
}

std::string flag_of(std::string key) {
  if (key == "init") return "ckpt";  // a post-training run's starting checkpoint
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

// Whether the stage settings table gives `key` the trait.
bool key_has(const std::string& key, StageKeyTraits trait) {
  for (const StageKey& row : stage_keys())
    if (row.key == key) return row.has(trait);
  return false;
}

// Every rank must run the same recipe into the same folder: a mismatch would pair different data in
// the collectives. The fingerprint's two 32-bit halves are exact in f64; their means equal every
// rank's own values only when all ranks agree.
void check_same_run_on_every_rank(Communicator& world, const std::string& run) {
  if (world.size() == 1) return;
  const uint64_t h = std::hash<std::string>{}(run);
  const std::vector<double> own = {static_cast<double>(h >> 32), static_cast<double>(h & 0xffffffffu)};
  Tensor mean = Tensor::from_vector<double>({2}, own);
  world.all_reduce(mean, ReduceOp::Mean);
  LT_CHECK(mean.to_vector<double>() == own,
           "this rank was started with other settings than the rest (recipe, flags, --out or --resume differ)");
}

// The first stage's batches come from the run's seed itself; a later stage's from a stream of it, so
// a stage that re-reads the same data does not repeat the first stage's order.
constexpr uint64_t kStageSamplerStream = 1000;
uint64_t stage_sampler_seed(uint64_t seed, int64_t stage) {
  return stage == 0 ? seed : derive_seed(seed, kStageSamplerStream + static_cast<uint64_t>(stage));
}

// The embedded default corpus, generated into <out>/data (byte tokenizer) or <out>/data-bpe the first
// time it is needed. data-bpe keeps a copy of the tokenizer.json it was made with, and is made again
// when the run's differs.
std::string ensure_default_corpus(const std::string& out_dir, const RunTokenizer& run_tokenizer, std::FILE* progress) {
  const bool bpe = !run_tokenizer.json_text.empty();
  const std::string dir = out_dir + (bpe ? "/data-bpe" : "/data");
  const std::string made_with = dir + "/tokenizer.json";
  const bool current = std::filesystem::exists(dir + "/corpus.json") &&
                       (!bpe || (std::filesystem::exists(made_with) && read_file(made_with) == run_tokenizer.json_text));
  if (!current) {
    std::fprintf(progress, "generating the default corpus into %s ...\n", dir.c_str());
    std::filesystem::create_directories(dir);
    write_corpus_shards(dir, kDefaultCorpusSeed, kDefaultCorpusBytes, *run_tokenizer.tokenizer);
    if (bpe) write_file_atomic(made_with, run_tokenizer.json_text);
  }
  return dir;
}

// Whether a run's --model fixes its vocabulary: a config.json with vocab_size does, a preset does not.
bool fixes_vocab_size(const std::string& model) {
  const std::vector<std::string> presets = preset_names();
  if (std::find(presets.begin(), presets.end(), model) != presets.end()) return false;
  return read_json_file(model).contains("vocab_size");
}

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

RunSetup::RunSetup(const Recipe& requested, const RunOptions& options) : options_(options), recipe_(requested) {
  LT_CHECK(options_.straggle_factor >= 1, "--straggle: the factor must be >= 1, got ", options_.straggle_factor);
  open_world();
  if (resuming()) resumed_ = std::make_unique<SharedCheckpoint>(*world_, options_.resume);
  if (resuming()) resume_recipe(requested);
  resume_dist_settings();
  open_expert_groups();
  LT_CHECK(options_.straggle_rank < world_->size(), "--straggle: rank ", options_.straggle_rank, " is outside the ",
           world_->size(), " ranks");
  // --dtype bf16 on a CPU without a bf16 GEMM (no AVX512_BF16), and --dtype tf32 (a GPU mode) on any CPU,
  // keep f32, and say so below.
  const bool bf16_stays_f32 = options_.matmul_precision == kernels::MatmulPrecision::BF16Inputs && device_.is_cpu() &&
                              !kernels::cpu_has_bf16_matmul();
  const bool tf32_stays_f32 = options_.matmul_precision == kernels::MatmulPrecision::TF32 && device_.is_cpu();
  precision_.emplace(bf16_stays_f32 || tf32_stays_f32 ? kernels::MatmulPrecision::F32 : options_.matmul_precision);
  check_same_run_on_every_rank(*world_, recipe_.to_json().dump() + options_.out_dir + options_.resume +
                                            dist_json().dump() + options_.spike_guard.to_json().dump() +
                                            options_.tokenizer);
  if (!lead()) discard_.reset(std::fopen("/dev/null", "w"));
  out_ = lead() ? options_.progress : discard_.get();
  if (bf16_stays_f32) std::fprintf(out_, "--dtype bf16: this CPU has no AVX512_BF16, so the matmuls stay f32\n");
  if (tf32_stays_f32) std::fprintf(out_, "--dtype tf32: TF32 is a GPU mode, so the matmuls on the CPU stay f32\n");
  make_model_and_tokenizer();
  if (options_.eval_mc == "embedded") {
    LT_CHECK(options_.eval_mc_items > 0, "--eval-mc embedded makes --eval-mc-items items: it must be > 0");
    multiple_choice_items_ =
        make_corpus_multiple_choice_items(kDefaultCorpusMultipleChoiceSeed, options_.eval_mc_items);
  } else if (!options_.eval_mc.empty()) {
    multiple_choice_items_ = read_multiple_choice_file(options_.eval_mc, options_.eval_mc_items);
    LT_CHECK(!multiple_choice_items_.empty(), options_.eval_mc, ": no multiple-choice item");
  }
  if (!resuming()) size_stages();
}

RunSetup::~RunSetup() = default;

void RunSetup::resume_recipe(const Recipe& requested) {
  saved_state_ = load_trainer_state(resume_folder());
  const std::string source = checkpoint_folder(resume_folder()) + "/trainer_state.json";
  LT_CHECK(saved_state_.contains("recipe") && saved_state_.contains("state"), source,
           ": no recipe or state (a checkpoint of an older lingtrain?)");
  Json recipe_json = saved_state_.at("recipe");
  for (const auto& [key, value] : options_.named_recipe_keys.items()) {
    if (key == "recipe") {
      const Json saved = recipe_identity(recipe_json), given = recipe_identity(requested.to_json());
      const Json patch = Json::diff(saved, given);  // JSON Patch: the first operation names the first difference
      if (!patch.empty()) {
        const Json::json_pointer at(patch[0].at("path").get<std::string>());
        auto at_in = [&](const Json& json) { return json.contains(at) ? json.at(at).dump() : std::string("nothing"); };
        fail("flag --recipe ", value.get<std::string>(), " is not the checkpoint's recipe: its ", at.to_string(), " is ",
             at_in(given), ", the checkpoint's ", at_in(saved));
      }
      continue;
    }
    const Json saved = recipe_json.value(key, Json());
    LT_CHECK(saved == value, "flag --", flag_of(key), " cannot change when resuming: the checkpoint's is ", saved.dump(),
             ", the command line's ", value.dump());
  }
  const int64_t stage = saved_state_.at("state").value("stage", int64_t{0});
  LT_CHECK(stage >= 0 && stage < static_cast<int64_t>(recipe_json.at("stages").size()), source, ": stage ", stage,
           " is not in its recipe");
  const int64_t stage_step = saved_state_.at("state").value("stage_step", int64_t{0});
  Json& saved_stage = recipe_json["stages"][stage];
  const Recipe saved_recipe = Recipe::from_json(recipe_json, source);
  const StageSettings& saved_settings = saved_recipe.stages[static_cast<size_t>(stage)];
  const int saved_world = saved_state_.value("dist", Json::object()).value("world_size", 1);
  // Another number of ranks mid-stage may divide the step's sequences otherwise (--batch x --accum x
  // ranks), as long as there are as many: the data cursor counts the windows every step takes.
  const bool regrouped = stage_step > 0 && saved_world != world_->size();
  for (const auto& [key, value] : options_.stage_overrides.items()) {
    const Json saved = saved_stage.value(key, value);
    // The data cursor counts windows of the saved shape: mid-stage, the shape of a batch is fixed.
    LT_CHECK(stage_step == 0 || !key_has(key, kFixedMidStage) || saved == value ||
                 (regrouped && (key == "batch" || key == "accum")),
             "flag --", flag_of(key), " cannot change in the middle of a stage when resuming (the checkpoint's is ",
             saved.dump(), ")");
    LT_CHECK(!key_has(key, kFixedOnResume) || saved == value, "flag --", flag_of(key),
             " cannot change when resuming: the checkpoint's is ", saved.dump(), ", the command line's ", value.dump());
    saved_stage[key] = value;
  }
  recipe_ = Recipe::from_json(recipe_json, source);
  if (regrouped) {
    const StageSettings& now = recipe_.stages[static_cast<size_t>(stage)];
    const int64_t saved_sequences = saved_settings.batch * saved_settings.accum * saved_world;
    LT_CHECK(now.batch * now.accum * world_->size() == saved_sequences, "a resume on ", world_->size(),
             " ranks in the middle of a stage takes the checkpoint's ", saved_sequences, " sequences a step (",
             saved_settings.batch, " x ", saved_settings.accum, " x ", saved_world, " ranks): --batch ", now.batch,
             " x --accum ", now.accum, " x ", world_->size(), " ranks is ", now.batch * now.accum * world_->size());
  }
  LT_CHECK(recipe_.stages[static_cast<size_t>(stage)].steps >= stage_step, "--steps ",
           recipe_.stages[static_cast<size_t>(stage)].steps, " is below the ", stage_step,
           " steps the checkpoint's stage has already taken");
}

void RunSetup::resume_dist_settings() {
  expert_parallel_ = options_.expert_parallel;
  shard_params_ = options_.shard_params && world_->size() > 1;
  if (!resuming()) {
    dist_ = options_.dist;
    edit_ = options_.edit;
    edit_.time_based = dist_ == DistMode::AEdit;
    return;
  }
  const std::string folder = checkpoint_folder(resume_folder());
  const Json saved = saved_state_.value("dist", Json{{"mode", "dp"}});
  // The checkpoint holds the whole model whatever its expert-parallel degree, so a resume may name another;
  // one that names none keeps the checkpoint's on as many ranks, and runs without on another number.
  if (!options_.named_dist_settings.contains("expert_parallel"))
    expert_parallel_ = saved.value("world_size", 1) == world_->size() ? saved.value("expert_parallel", 1) : 1;
  if (!options_.named_dist_settings.contains("shard_params"))
    shard_params_ = saved.value("world_size", 1) == world_->size() && saved.value("shard_params", false);
  const std::string source = folder + "/trainer_state.json";
  const EditSettings saved_edit =
      saved.contains("edit") ? EditSettings::from_json(saved.at("edit"), source) : EditSettings{};
  checkpoint_layout_ = {parse_dist_mode(saved.value("mode", std::string("dp"))), saved.value("world_size", 1),
                        saved_edit.shard_group, saved.value("expert_parallel", 1), saved.value("shard_params", false)};
  const Json& named = options_.named_dist_settings;
  dist_ = named.contains("mode") ? options_.dist : checkpoint_layout_.mode;
  if (dist_ == checkpoint_layout_.mode) {
    // The checkpoint's settings, with what the command line names.
    Json settings = saved_edit.to_json();
    for (const auto& [key, value] : named.items()) {
      if (key == "mode" || key == "expert_parallel" || key == "shard_params") continue;
      LT_CHECK(dist_ != DistMode::DataParallel, folder, ": written by a --dist dp run, which has no EDiT setting '",
               key, "'");
      settings[key] = value;
    }
    edit_ = EditSettings::from_json(settings, source);
  } else {
    edit_ = options_.edit;
  }
  edit_.time_based = dist_ == DistMode::AEdit;
  relayout_ = dist_ != checkpoint_layout_.mode || world_->size() != checkpoint_layout_.world_size ||
              (dist_ != DistMode::DataParallel && edit_.shard_group != checkpoint_layout_.shard_group) ||
              expert_parallel_ != checkpoint_layout_.expert_parallel ||
              shard_params_ != checkpoint_layout_.shard_params;
  if (relayout_) return;
  // An exact resume continues the run as it was: its settings cannot change.
  const Json saved_json = saved_edit.to_json();
  for (const auto& [key, value] : named.items())
    LT_CHECK(key == "mode" || key == "expert_parallel" || key == "shard_params" ||
                 saved_json.value(key, Json()) == value,
             "EDiT setting '", key, "' cannot change when resuming on the same layout: the checkpoint's is ",
             saved_json.value(key, Json()).dump(), ", the command line's ", value.dump());
}

Json RunSetup::dist_json() const {
  return {{"mode", dist_mode_name(dist_)},
          {"world_size", world_->size()},
          {"expert_parallel", expert_parallel_},
          {"shard_params", shard_params_},
          {"edit", edit_.to_json()}};
}

void RunSetup::open_world() {
  host_world_ = make_world_communicator();
  // One GPU per rank under mpirun: rank r drives GPU r mod (the GPUs it sees).
  device_ = options_.device;
  if (device_.is_cuda() && host_world_->size() > 1) {
    device_ = nccl_device(host_world_->rank());
    gpu_world_ = route_by_device(*host_world_, make_nccl_communicator(*host_world_));
  }
  world_ = gpu_world_ ? gpu_world_.get() : host_world_.get();
}

// The layout is checked before anything is allocated: one clear line for a degree the ranks or the run
// cannot take (the model's experts are checked as the model is made).
void RunSetup::open_expert_groups() {
  const int G = expert_parallel_, ranks = world_->size();
  if (G == 1) return;
  LT_CHECK(G >= 1 && ranks % G == 0, "--expert-parallel ", G, " does not divide the ", ranks,
           " ranks (mpirun -n N: N a multiple of it)");
  LT_CHECK(dist_ == DistMode::DataParallel || edit_.shard_group == 1, "--shard-group ", edit_.shard_group,
           " with --expert-parallel ", G, ": under EDiT a replica is its expert-parallel group, not sharded further "
           "(yet)");
  // Consecutive ranks split the experts: on a cluster they are one node's, where the all-to-all is cheapest.
  const int rank = world_->rank();
  expert_group_ = world_->split(rank / G, rank);
  expert_copies_ = world_->split(rank % G, rank);
  expert_exchange_ = std::make_unique<ExpertCommunicatorGroup>(*expert_group_);
}

void RunSetup::make_model_and_tokenizer() {
  // The checkpoint the weights come from: the one resumed, else the recipe's starting one (post-training).
  const std::string source = resuming() ? resume_folder() : recipe_.init;
  LingConfig config = source.empty() ? resolve_config(recipe_.model) : load_checkpoint_config(source);
  if (source.empty() && !options_.tokenizer.empty() && !fixes_vocab_size(recipe_.model)) {
    // A preset's table follows the tokenizer it trains with: its vocabulary rounded up to a multiple of 64
    // (whole SIMD and GEMM tiles). The stage's first progress line says so.
    const int64_t tokens = load_tokenizer(options_.tokenizer)->vocab_size(), vocab = round_up(tokens, 64);
    if (vocab != config.vocab_size)
      vocab_note_ = format_text("vocab_size %lld (the tokenizer's %lld tokens rounded up to 64; the preset's is %lld)",
                                static_cast<long long>(vocab), static_cast<long long>(tokens),
                                static_cast<long long>(config.vocab_size));
    config.vocab_size = vocab;
  }
  const int G = expert_parallel_;
  LT_CHECK(G == 1 || config.num_experts > 0, "--expert-parallel ", G, ": model ", config.name,
           " is dense, it has no routed experts to split");
  LT_CHECK(G == 1 || config.num_experts % G == 0, "--expert-parallel ", G, ": model ", config.name, "'s ",
           config.num_experts, " routed experts per MoE layer do not split over ", G, " ranks");
  model_ = std::make_unique<LingForCausalLM>(config, recipe_.seed, ExpertSlice{world_->rank() % G, G});
  if (expert_exchange_) model_->set_expert_group(expert_exchange_.get());
  if (!resuming() && !recipe_.init.empty()) load_checkpoint_weights(recipe_.init, *model_);
  model_->to(device_);
  // A run from a checkpoint keeps the tokenizer that checkpoint was trained with; --tokenizer may only
  // name it again.
  if (source.empty()) {
    if (!options_.tokenizer.empty()) tokenizer_.json_text = read_file(options_.tokenizer);
  } else {
    tokenizer_.json_text = load_checkpoint_tokenizer_json(source);
    LT_CHECK(options_.tokenizer.empty() || read_file(options_.tokenizer) == tokenizer_.json_text, "flag --tokenizer ",
             options_.tokenizer, " is not the tokenizer ", checkpoint_folder(source),
             " was trained with; a run cannot change its tokenizer");
  }
  tokenizer_.tokenizer = resolve_tokenizer(source.empty() ? options_.tokenizer : "", source, config.vocab_size);
}

void RunSetup::size_stages() {
  for (StageSettings& stage : recipe_.stages) {
    std::string note;
    if (stage.kind == StageKind::Pretrain) note = check_pretrain_data(stage);
    // Post-training data is read before anything is written (a file that cannot be trained on stops the
    // run with nothing made), and stages sized in epochs get their steps from it.
    if (stage.kind != StageKind::Pretrain) {
      const int64_t rows = packed_train_rows(stage, *tokenizer_.tokenizer);
      if (stage.steps == 0) {
        const double rows_per_step = static_cast<double>(stage.batch * stage.accum * world_->size());
        stage.steps = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(stage.epochs * static_cast<double>(rows) / rows_per_step)));
      }
    }
    // A warmup as long as the stage would leave its decay unreached (a 20-step cosine run ending at its
    // peak rate): it becomes a tenth of the stage, and the run says so.
    if (stage.warmup_steps > 0 && stage.warmup_steps >= stage.steps) {
      const int64_t fitted = stage.steps / 10;
      note += std::string(note.empty() ? "" : "; ") +
              format_text("stage '%s': a warmup of %lld steps is not shorter than its %lld steps; %s",
                          stage.name.c_str(), static_cast<long long>(stage.warmup_steps),
                          static_cast<long long>(stage.steps),
                          fitted > 0 ? format_text("warming up over %lld instead", static_cast<long long>(fitted)).c_str()
                                     : "no warmup instead");
      stage.warmup_steps = fitted;
    }
    stage_notes_.push_back(note);
  }
}

std::vector<SamplerSource> RunSetup::pretrain_sources(const StageSettings& stage) {
  const int64_t vocab = model_->config().vocab_size;
  std::vector<SamplerSource> sources;
  for (const DataSource& source : stage.data.sources)
    sources.push_back({source.name, TokenShards::open(source.path, vocab, /*random_access=*/true), source.weight});
  if (sources.empty())
    sources.push_back({"", TokenShards::open(default_corpus_ + "/train.bin", vocab, /*random_access=*/true), 1.0});
  return sources;
}

// Rank 0 makes the embedded corpus when the stage trains on it (the others wait for it to be complete).
void RunSetup::prepare_default_corpus(const StageSettings& stage) {
  if (stage.kind != StageKind::Pretrain || !stage.data.empty() || !default_corpus_.empty()) return;
  if (lead()) default_corpus_ = ensure_default_corpus(options_.out_dir, tokenizer_, out_);
  world_->barrier();
  if (!lead()) default_corpus_ = ensure_default_corpus(options_.out_dir, tokenizer_, out_);
}

std::unique_ptr<StageBatches> RunSetup::stage_batches(int64_t stage_index) {
  const StageSettings& stage = recipe_.stages[static_cast<size_t>(stage_index)];
  const uint64_t sampler_seed = stage_sampler_seed(recipe_.seed, stage_index);
  std::unique_ptr<StageBatches> batches;
  if (stage.kind == StageKind::Pretrain) {
    prepare_default_corpus(stage);
    val_path_ = !stage.val.empty() ? stage.val : stage.data.empty() ? default_corpus_ + "/val.bin" : "";
    std::optional<TokenShards> val;
    if (!val_path_.empty()) val = TokenShards::open(val_path_, model_->config().vocab_size);
    return window_batches(pretrain_sources(stage), std::move(val), stage.batch, stage.seq, sampler_seed,
                          world_->rank(), world_->size());
  }
  auto prepare = [&]() {
    PostTrainingInputs inputs;
    inputs.tokenizer = tokenizer_.tokenizer.get();
    inputs.tokenizer_json = tokenizer_.json_text;
    inputs.cache_dir = options_.out_dir + "/reference";
    inputs.seed = sampler_seed;
    inputs.rank = world_->rank();
    inputs.world_size = world_->size();
    inputs.progress = out_;
    inputs.device = device_;
    batches = post_training_batches(stage, inputs);
  };
  // Rank 0 first: it caches DPO's reference log-probs, which the others then read.
  if (lead()) prepare();
  world_->barrier();
  if (!lead()) prepare();
  return batches;
}

// Pre-training data is opened before anything is written too (a missing file, a bad shard, a set without
// a whole window stop the run with nothing made). on_exhausted end: the stage's steps are as many as its
// data gives before a source would start another epoch (a step takes its micro-batches' windows on every
// rank), so its schedule ends where its data does.
std::string RunSetup::check_pretrain_data(StageSettings& stage) {
  if (!stage.val.empty()) TokenShards::open(stage.val, model_->config().vocab_size);
  if (stage.data.empty() && stage.on_exhausted != "end") return "";  // the embedded corpus, made as the stage begins
  prepare_default_corpus(stage);
  // (An epoch's windows depend on the offsets its seed draws.)
  const int64_t index = &stage - recipe_.stages.data();
  const BatchSampler sampler(pretrain_sources(stage), stage.batch, stage.seq, stage_sampler_seed(recipe_.seed, index));
  if (stage.on_exhausted != "end") return "";
  const BatchSampler::Exhaustion runs_out = sampler.first_exhaustion();
  int64_t steps = 0, left = runs_out.windows;
  const int64_t ramp_steps = stage.ramp().ramp_steps;
  while (steps < stage.steps) {
    const int64_t step_windows = stage.micro_batches_at(steps) * stage.batch * world_->size();
    if (steps >= ramp_steps) {  // every step alike from here
      steps += std::min(stage.steps - steps, left / step_windows);
      break;
    }
    if (step_windows > left) break;
    left -= step_windows;
    ++steps;
  }
  const std::string source = runs_out.source.empty() ? "its data" : "source '" + runs_out.source + "'";
  LT_CHECK(steps > 0, "stage '", stage.name, "': ", source, " runs out (", runs_out.windows, " windows of ",
           stage.seq + 1, " tokens) before its first step");
  if (steps == stage.steps) return "";
  const std::string note =
      format_text("stage '%s': %s runs out after %lld steps (on_exhausted end); the stage ends there",
                  stage.name.c_str(), source.c_str(), static_cast<long long>(steps));
  stage.steps = steps;
  return note;
}

std::string RunSetup::stage_note(int64_t stage) const {
  return static_cast<size_t>(stage) < stage_notes_.size() ? stage_notes_[static_cast<size_t>(stage)] : std::string();
}

std::string RunSetup::heldout_path(int64_t stage) const {
  const StageSettings& s = recipe_.stages[static_cast<size_t>(stage)];
  return s.kind == StageKind::Pretrain ? val_path_ : s.val;
}

}  // namespace lt
