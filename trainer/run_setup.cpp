#include "trainer/run_setup.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "data/corpus.h"
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

}  // namespace

RunSetup::RunSetup(const Recipe& requested, const RunOptions& options) : options_(options), recipe_(requested) {
  LT_CHECK(options_.straggle_factor >= 1, "--straggle: the factor must be >= 1, got ", options_.straggle_factor);
  open_world();
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
  if (!resuming()) size_stages();
}

RunSetup::~RunSetup() = default;

void RunSetup::resume_recipe(const Recipe& requested) {
  saved_state_ = load_trainer_state(options_.resume);
  const std::string source = checkpoint_folder(options_.resume) + "/trainer_state.json";
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
  const std::string folder = checkpoint_folder(options_.resume);
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
  const std::string source = resuming() ? options_.resume : recipe_.init;
  const LingConfig config = source.empty() ? resolve_config(recipe_.model) : load_checkpoint_config(source);
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
    std::string note;
    if (stage.warmup_steps > 0 && stage.warmup_steps >= stage.steps) {
      const int64_t fitted = stage.steps / 10;
      note = format_text("stage '%s': a warmup of %lld steps is not shorter than its %lld steps; %s", stage.name.c_str(),
                         static_cast<long long>(stage.warmup_steps), static_cast<long long>(stage.steps),
                         fitted > 0 ? format_text("warming up over %lld instead", static_cast<long long>(fitted)).c_str()
                                    : "no warmup instead");
      stage.warmup_steps = fitted;
    }
    stage_notes_.push_back(note);
  }
}

std::unique_ptr<StageBatches> RunSetup::stage_batches(int64_t stage_index) {
  const StageSettings& stage = recipe_.stages[static_cast<size_t>(stage_index)];
  const uint64_t sampler_seed = stage_sampler_seed(recipe_.seed, stage_index);
  std::unique_ptr<StageBatches> batches;
  auto prepare = [&]() {
    if (stage.kind == StageKind::Pretrain) {
      std::string train_path = stage.data, val_path = stage.val;
      if (train_path.empty()) {
        const std::string corpus = ensure_default_corpus(options_.out_dir, tokenizer_, out_);
        train_path = corpus + "/train.bin";
        if (val_path.empty()) val_path = corpus + "/val.bin";
      }
      const int64_t vocab = model_->config().vocab_size;
      if (train_path != train_path_) train_tokens_ = read_token_shard_tensor(train_path, vocab);
      if (val_path != val_path_) val_tokens_ = val_path.empty() ? Tensor() : read_token_shard_tensor(val_path, vocab);
      train_path_ = train_path;
      val_path_ = val_path;
      LT_CHECK(train_tokens_.numel() > stage.seq, train_path, ": ", train_tokens_.numel(),
               " tokens, fewer than seq + 1 (", stage.seq + 1, ") of stage '", stage.name, "'");
      batches = window_batches(train_tokens_, val_tokens_, stage.batch, stage.seq, sampler_seed, world_->rank(),
                               world_->size(), train_path + " (" + std::to_string(train_tokens_.numel()) + " tokens)");
      return;
    }
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
  if (lead()) prepare();
  world_->barrier();
  if (!lead()) prepare();
  return batches;
}

std::string RunSetup::stage_note(int64_t stage) const {
  return static_cast<size_t>(stage) < stage_notes_.size() ? stage_notes_[static_cast<size_t>(stage)] : std::string();
}

std::string RunSetup::heldout_path(int64_t stage) const {
  const StageSettings& s = recipe_.stages[static_cast<size_t>(stage)];
  return s.kind == StageKind::Pretrain ? val_path_ : s.val;
}

}  // namespace lt
