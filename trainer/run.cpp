#include "trainer/run.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <optional>

#include "data/corpus.h"
#include "tensor/derive_seed.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "dist/nccl_communicator.h"
#include "dist/edit.h"
#include "optim/spike_guard.h"
#include "io/atomic_file.h"
#include "io/format_text.h"
#include "io/input_file.h"
#include "io/metrics.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluate.h"
#include "trainer/generate.h"
#include "trainer/progress.h"
#include "trainer/stage_batches.h"
#include "trainer/trainer.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"

namespace lt {

namespace {

using Clock = std::chrono::steady_clock;

// The run's tokenizer: its tokenizer.json text ("" for the byte tokenizer) and the tokenizer itself.
struct RunTokenizer {
  std::string json_text;
  std::unique_ptr<Tokenizer> tokenizer;
};

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

// The first stage's batches come from the run's seed itself; a later stage's from a stream of it, so
// a stage that re-reads the same data does not repeat the first stage's order.
constexpr uint64_t kStageSamplerStream = 1000;
uint64_t stage_sampler_seed(uint64_t seed, int64_t stage) {
  return stage == 0 ? seed : derive_seed(seed, kStageSamplerStream + static_cast<uint64_t>(stage));
}

// What the progress line shows of a step's record: the worst expert-load imbalance among the layers.
ProgressFigures progress_figures(const Json& record, double loss, double lr, double grad_norm) {
  ProgressFigures f;
  f.step = record.value("step", int64_t{0});
  f.loss = loss;
  f.lr = lr;
  f.grad_norm = grad_norm;
  f.tokens_per_s = record.value("tokens_per_s", NAN);
  if (record.contains("moe_layers"))
    for (const Json& layer : record["moe_layers"]) {
      const double imbalance = layer.value("max_over_mean", 0.0);
      if (std::isnan(f.worst_imbalance) || imbalance > f.worst_imbalance) {
        f.worst_imbalance = imbalance;
        f.worst_imbalance_layer = layer.value("layer", int64_t{-1});
      }
    }
  return f;
}

// A stage's token arrays, read once and kept while consecutive stages name the same files.
struct StageData {
  std::string train_path, val_path;
  Tensor train, val;  // val undefined when the stage has no held-out file
};

StageData stage_data(const StageSettings& stage, const RunOptions& options, const RunTokenizer& run_tokenizer,
                     int64_t vocab, StageData previous) {
  std::string train_path = stage.data, val_path = stage.val;
  if (train_path.empty()) {
    const std::string corpus = ensure_default_corpus(options.out_dir, run_tokenizer, options.progress);
    train_path = corpus + "/train.bin";
    if (val_path.empty()) val_path = corpus + "/val.bin";
  }
  StageData data;
  data.train_path = train_path;
  data.val_path = val_path;
  data.train = train_path == previous.train_path ? previous.train : read_token_shard_tensor(train_path, vocab);
  if (!val_path.empty())
    data.val = val_path == previous.val_path ? previous.val : read_token_shard_tensor(val_path, vocab);
  LT_CHECK(data.train.numel() > stage.seq, train_path, ": ", data.train.numel(), " tokens, fewer than seq + 1 (",
           stage.seq + 1, ") of stage '", stage.name, "'");
  return data;
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

// The step's statistics over all ranks: the losses and entropies averaged, the expert loads added (the
// token counts are already global) and so are the objective's sums; the largest router logit is the
// largest of any rank (each rank's in its own slot of the sum). Returns whether any rank asked to stop.
bool share_step_statistics(DataParallel& dp, StepStats& stats, bool stop) {
  const int ranks = dp.comm().size(), rank = dp.comm().rank();
  if (ranks == 1) return stop;
  std::vector<double> values = {stats.loss, stats.lm_loss, stats.aux_loss, stats.balance_loss, stats.z_loss,
                                stop ? 1.0 : 0.0};
  for (const LayerRouting& layer : stats.moe_layers) {
    values.push_back(layer.routing_entropy);
    values.insert(values.end(), layer.tokens_per_expert.begin(), layer.tokens_per_expert.end());
    for (int r = 0; r < ranks; ++r) values.push_back(r == rank ? layer.max_logit : 0.0);
  }
  values.insert(values.end(), stats.objective_stats.begin(), stats.objective_stats.end());  // sums: added up
  dp.sum(values);
  size_t i = 0;
  for (double* mean : {&stats.loss, &stats.lm_loss, &stats.aux_loss, &stats.balance_loss, &stats.z_loss})
    *mean = values[i++] / ranks;
  const bool any_stop = values[i++] > 0;
  for (LayerRouting& layer : stats.moe_layers) {
    layer.routing_entropy = values[i++] / ranks;
    for (int64_t& load : layer.tokens_per_expert) load = static_cast<int64_t>(values[i++]);
    layer.max_logit = *std::max_element(values.begin() + static_cast<int64_t>(i), values.begin() + static_cast<int64_t>(i) + ranks);
    i += static_cast<size_t>(ranks);
  }
  for (double& sum : stats.objective_stats) sum = values[i++];
  return any_stop;
}

// Where a checkpoint folder keeps rank r's own state in an EDiT run.
std::string rank_state_path(const std::string& folder, int rank) {
  char name[48];
  std::snprintf(name, sizeof name, "/edit/rank-%05d.safetensors", rank);
  return folder + name;
}

}  // namespace

Json run_training(const Recipe& requested, const RunOptions& options) {
  // A resumed run continues the checkpoint's recipe, with the overrides applied to the resumed stage.
  Recipe recipe = requested;
  Json saved_state;
  if (!options.resume.empty()) {
    saved_state = load_trainer_state(options.resume);
    const std::string source = checkpoint_folder(options.resume) + "/trainer_state.json";
    LT_CHECK(saved_state.contains("recipe") && saved_state.contains("state"), source,
             ": no recipe or state (a checkpoint of an older lingtrain?)");
    Json recipe_json = saved_state.at("recipe");
    const int64_t stage = saved_state.at("state").value("stage", int64_t{0});
    LT_CHECK(stage >= 0 && stage < static_cast<int64_t>(recipe_json.at("stages").size()), source, ": stage ", stage,
             " is not in its recipe");
    const int64_t stage_step = saved_state.at("state").value("stage_step", int64_t{0});
    for (const auto& [key, value] : options.stage_overrides.items()) {
      // The data cursor counts windows of the saved shape: mid-stage, the shape of a batch is fixed.
      LT_CHECK(stage_step == 0 || (key != "seq" && key != "batch" && key != "accum") ||
                   recipe_json["stages"][stage].value(key, value) == value,
               "flag --", key, " cannot change in the middle of a stage when resuming (the checkpoint's is ",
               recipe_json["stages"][stage].value(key, Json()).dump(), ")");
      recipe_json["stages"][stage][key] = value;
    }
    recipe = Recipe::from_json(recipe_json, source);
    LT_CHECK(recipe.stages[static_cast<size_t>(stage)].steps >= stage_step, "--steps ",
             recipe.stages[static_cast<size_t>(stage)].steps, " is below the ", stage_step,
             " steps the checkpoint's stage has already taken");
  }
  // Under mpirun every rank runs this function; rank 0 alone writes the metrics, the checkpoints and
  // the progress lines, and evaluates.
  LT_CHECK(options.dist == "dp" || options.dist == "edit" || options.dist == "aedit", "unknown --dist '", options.dist,
           "' (dp, edit, aedit)");
  LT_CHECK(options.straggle_factor >= 1, "--straggle: the factor must be >= 1, got ", options.straggle_factor);
  const std::unique_ptr<Communicator> host_world = make_world_communicator();
  // One GPU per rank under mpirun: rank r drives GPU r mod (the GPUs it sees). Tensors on the GPUs
  // travel through NCCL, host data (the agreement between ranks, statistics, EDiT's tables) through MPI.
  Device device = options.device;
  std::unique_ptr<Communicator> gpu_world;
  if (device.is_cuda() && host_world->size() > 1) {
    device = nccl_device(host_world->rank());
    gpu_world = route_by_device(*host_world, make_nccl_communicator(*host_world));
  }
  Communicator* const world = gpu_world ? gpu_world.get() : host_world.get();
  DataParallel data_parallel(*world);
  const bool lead = world->rank() == 0;
  // --dtype bf16 on a CPU without a bf16 GEMM (no AVX512_BF16) keeps f32, and says so below.
  const bool bf16_stays_f32 = options.matmul_precision == kernels::MatmulPrecision::BF16Inputs && device.is_cpu() &&
                              !kernels::cpu_has_bf16_matmul();
  // The run's matmul precision for its whole length, the process's previous one back after it.
  struct PrecisionScope {
    kernels::MatmulPrecision previous = kernels::matmul_precision();
    explicit PrecisionScope(kernels::MatmulPrecision p) { kernels::set_matmul_precision(p); }
    ~PrecisionScope() { kernels::set_matmul_precision(previous); }
  } precision_scope(bf16_stays_f32 ? kernels::MatmulPrecision::F32 : options.matmul_precision);
  const bool local_sgd = options.dist != "dp";
  EditSettings edit_settings = options.edit;
  edit_settings.time_based = options.dist == "aedit";
  const Json dist_json = {{"mode", options.dist}, {"world_size", world->size()}, {"edit", edit_settings.to_json()}};
  check_same_run_on_every_rank(*world, recipe.to_json().dump() + options.out_dir + options.resume + dist_json.dump() +
                                           options.spike_guard.to_json().dump() + options.tokenizer);
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> silent(lead ? nullptr : std::fopen("/dev/null", "w"),
                                                                 &std::fclose);
  std::FILE* out = lead ? options.progress : silent.get();
  if (bf16_stays_f32) std::fprintf(out, "--dtype bf16: this CPU has no AVX512_BF16, so the matmuls stay f32\n");
  if (!options.resume.empty()) {
    const Json saved_dist = saved_state.value("dist", Json{{"mode", "dp"}, {"world_size", 1}});
    const bool saved_local_sgd = saved_dist.value("mode", std::string("dp")) != "dp";
    LT_CHECK(saved_local_sgd == local_sgd, checkpoint_folder(options.resume), ": written by a --dist ",
             saved_dist.value("mode", std::string("dp")), " run; resume it with that --dist");
  }

  // The checkpoint the weights come from: the one resumed, else the recipe's starting one (post-training).
  const std::string source_checkpoint = !options.resume.empty() ? options.resume : recipe.init;
  const LingConfig config =
      source_checkpoint.empty() ? resolve_config(recipe.model) : load_checkpoint_config(source_checkpoint);
  LingForCausalLM model(config, recipe.seed);
  if (options.resume.empty() && !recipe.init.empty()) load_checkpoint_weights(recipe.init, model);
  model.to(device);
  // A run from a checkpoint keeps the tokenizer that checkpoint was trained with; --tokenizer may only
  // name it again.
  RunTokenizer run_tokenizer;
  if (source_checkpoint.empty()) {
    if (!options.tokenizer.empty()) run_tokenizer.json_text = read_file(options.tokenizer);
  } else {
    run_tokenizer.json_text = load_checkpoint_tokenizer_json(source_checkpoint);
    LT_CHECK(options.tokenizer.empty() || read_file(options.tokenizer) == run_tokenizer.json_text, "flag --tokenizer ",
             options.tokenizer, " is not the tokenizer ", checkpoint_folder(source_checkpoint),
             " was trained with; a run cannot change its tokenizer");
  }
  run_tokenizer.tokenizer =
      resolve_tokenizer(source_checkpoint.empty() ? options.tokenizer : "", source_checkpoint, config.vocab_size);

  // Post-training data is read before anything is written (a file that cannot be trained on stops the
  // run with nothing made), and stages sized in epochs get their steps from it.
  if (options.resume.empty())
    for (StageSettings& stage : recipe.stages) {
      if (stage.kind == StageKind::Pretrain) continue;
      const int64_t rows = packed_train_rows(stage, *run_tokenizer.tokenizer);
      if (stage.steps > 0) continue;
      const double rows_per_step = static_cast<double>(stage.batch * stage.accum * world->size());
      stage.steps = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(stage.epochs * static_cast<double>(rows) / rows_per_step)));
    }

  TrainerSettings settings;
  settings.seed = recipe.seed;
  settings.routing_warmup_steps = recipe.routing_warmup;
  settings.rank = world->rank();
  settings.world_size = world->size();
  std::optional<EditMesh> mesh;
  if (local_sgd) {
    mesh = EditMesh::build(*world, edit_settings.shard_group);
    settings.shard = mesh->shard();
    settings.shards = mesh->shards();
  }
  // Test-only faults (--inject): the loss of the first `count` attempts at a step scaled, or made NaN.
  std::map<int64_t, int64_t> injected_attempts;
  Objective stage_objective = language_model_objective;  // the current stage's (set as it starts)
  Objective objective = language_model_objective;
  if (!options.injections.empty())
    objective = [&](LingForCausalLM& m, const TokenBatch& batch, MoEContext& context) {
      LossBreakdown loss = stage_objective(m, batch, context);
      for (const Injection& injection : options.injections)
        if (injection.step == context.step && injected_attempts[injection.step] < injection.count) {
          const double factor = injection.kind == "nan" ? NAN : injection.factor;
          loss.total = scale(loss.total, factor);
          loss.lm = scale(loss.lm, factor);
        }
      return loss;
    };
  Trainer trainer(model, settings, objective);
  TrainState& state = trainer.state();
  std::unique_ptr<Edit> edit;
  if (local_sgd) {
    edit = std::make_unique<Edit>(std::move(*mesh), edit_settings, trainer.parameters(), model);
    trainer.hooks().after_backward = [&](FlatParameters&) { edit->reduce_gradients(state.step); };
    trainer.hooks().complete_grad_sum_squares = [&](double own) { return edit->complete_grad_sum_squares(own); };
    trainer.hooks().after_update = [&](FlatParameters&) { edit->share_updated_shard(); };
  } else {
    trainer.hooks().after_backward = [&](FlatParameters& params) { data_parallel.average(params, model); };
  }
  int64_t steps_since_sync = 0;  // this replica's steps since the last EDiT sync
  const FlatParameters::Range owned = trainer.optimizer().owned();
  SpikeGuard guard(options.spike_guard);
  // A checkpoint's weights, optimiser and training state into this run: to resume, and to recover from
  // a diverged step. Under EDiT each rank reads its own state and the replica's shards are gathered.
  auto restore = [&](const std::string& dir, bool reloading) {
    const std::string folder = checkpoint_folder(dir);
    const Json saved = load_trainer_state(dir);
    load_checkpoint_weights(dir, model);
    train_state_from_json(saved.at("state"), folder + "/trainer_state.json", state, model);
    // A reload keeps the guard as it is: its count of reloads and its cuts must outlive the reload.
    if (!reloading && saved.contains("spike_guard")) guard.load(saved.at("spike_guard"), folder + "/trainer_state.json");
    if (!edit) {
      load_checkpoint_optimizer(dir, trainer.optimizer());
      return;
    }
    const std::string path = rank_state_path(folder, world->rank());
    LT_CHECK(std::filesystem::exists(path), path, ": missing (resume an EDiT checkpoint with the same number of ranks)");
    const SafetensorsFile file = load_safetensors(path);
    const auto text = file.metadata.find("state");
    LT_CHECK(text != file.metadata.end(), path, ": no 'state' in the metadata");
    const Json own = parse_json(text->second, path);
    const JsonObject fields(own, path);
    train_state_from_json(fields.object("state").json(), path, state, model);
    trainer.optimizer().load_shard_state({{"exp_avg", file.get("exp_avg")}, {"exp_avg_sq", file.get("exp_avg_sq")}},
                                         fields.get<int64_t>("adamw_steps"), path);
    trainer.parameters().values().narrow(owned.begin, owned.size()).copy_from(file.get("values", {owned.size()}, DType::F32));
    edit->load_state(file.tensors, fields.object("edit").json(), path);
    edit->share_updated_shard();
    steps_since_sync = fields.get<int64_t>("steps_since_sync");
  };
  if (!options.resume.empty()) restore(options.resume, /*reloading=*/false);
  // The guard's inputs are the same on every rank that must decide together: the whole world (dp,
  // edit), or the ranks of one replica (aedit, whose replicas never wait for each other).
  Communicator* agreeing = !local_sgd ? world : edit_settings.time_based ? edit->mesh().shard_group.get() : world;
  std::optional<SpikeGuard::Verdict> verdict;
  trainer.hooks().before_update = [&](const StepStats& stats) {
    Tensor observed = Tensor::from_vector<double>({2}, {stats.loss, stats.grad_norm});
    if (agreeing->size() > 1) agreeing->all_reduce(observed, ReduceOp::Mean);
    const std::vector<double> mean = observed.to_vector<double>();
    for (const Injection& injection : options.injections)
      if (injection.step == state.step) {
        ++injected_attempts[state.step];
        break;
      }
    verdict = guard.judge(state.step, mean[0], mean[1]);
    const bool update = verdict->action == SpikeGuard::Action::Apply || verdict->action == SpikeGuard::Action::Accept;
    return update ? UpdateDecision::Apply : UpdateDecision::Retry;
  };

  if (lead) std::filesystem::create_directories(options.out_dir);
  const std::string metrics_path =
      !lead ? "" : options.metrics_path.empty() ? options.out_dir + "/metrics.jsonl" : options.metrics_path;
  // A fresh run starts its log anew (a folder may hold an earlier run's); a resumed one continues it.
  if (lead && options.resume.empty()) std::filesystem::remove(metrics_path);
  MetricsLog metrics(metrics_path, options.resume.empty() ? -1 : state.step);
  const ParameterCount counts = count_parameters(config);
  const int64_t total_steps = recipe.total_steps();
  const bool interactive = lead && isatty(fileno(out));
  winsize terminal{};
  const int columns = interactive && ioctl(fileno(out), TIOCGWINSZ, &terminal) == 0 ? terminal.ws_col : 0;
  ProgressLine progress(out, interactive, columns, total_steps, state.step);
  const auto run_start = Clock::now();
  const int64_t first_step = state.step;
  LT_CHECK(options.straggle_rank < world->size(), "--straggle: rank ", options.straggle_rank, " is outside the ",
           world->size(), " ranks");
  const std::string checkpoint_dir = options.out_dir + "/checkpoint";
  auto bytes_sent = [&]() { return world->bytes_sent() + (edit ? edit->bytes_sent() : 0); };

  StageData data;  // the token arrays of the last pre-training stage
  std::unique_ptr<StageBatches> batches;  // of the current stage
  int64_t T = 0, B = 0;  // of the current stage, set as it starts
  // Collective under EDiT (every rank's own state travels to rank 0, which writes the one folder).
  auto save = [&]() {
    // A non-finite weight would make every later resume diverge at once; the guard keeps them out, and
    // this keeps them out of the checkpoint whatever happened.
    Tensor sum_squares = Tensor::empty({1}, trainer.parameters().values().dtype(), device);
    kernels::sum_squares(trainer.parameters().values(), sum_squares);
    LT_CHECK(std::isfinite(sum_squares.item()), "the weights are not finite at step ", state.step,
             ": not writing a checkpoint over ", checkpoint_dir);
    const Json trainer_state = {{"state", train_state_to_json(state, model)},
                                {"recipe", recipe.to_json()},
                                {"seq_len", T},
                                {"dist", dist_json},
                                {"spike_guard", guard.to_json()}};
    if (!edit) {
      if (lead)
        save_checkpoint(checkpoint_dir, model, &trainer.optimizer(), trainer_state, run_tokenizer.json_text, {},
                        options.save_dtype);
      return;
    }
    NamedTensors own = {{"values", trainer.parameters().values().narrow(owned.begin, owned.size())}};
    for (const auto& t : trainer.optimizer().shard_state()) own.push_back(t);
    for (const auto& t : edit->state_tensors()) own.push_back(t);
    // The shards are gathered to rank 0 in host memory, where the checkpoint is written.
    for (auto& [name, t] : own) t = t.to(Device::cpu());
    const Json own_json = {{"state", train_state_to_json(state, model)},
                           {"adamw_steps", trainer.optimizer().steps_taken()},
                           {"edit", edit->state_json()},
                           {"steps_since_sync", steps_since_sync}};
    const std::vector<std::string> texts = gather_text(*world, own_json.dump(), 0);
    std::vector<Tensor> all;
    for (const auto& [name, t] : own) {
      all.push_back(lead ? Tensor::empty({t.numel() * world->size()}, t.dtype()) : Tensor());
      world->gather(t, all.back(), 0);
    }
    if (!lead) return;
    save_checkpoint(checkpoint_dir, model, nullptr, trainer_state, run_tokenizer.json_text, [&](const std::string& staging) {
      std::filesystem::create_directories(staging + "/edit");
      for (int r = 0; r < world->size(); ++r) {
        NamedTensors rank_tensors;
        for (size_t i = 0; i < own.size(); ++i)
          rank_tensors.emplace_back(own[i].first, all[i].narrow(r * own[i].second.numel(), own[i].second.numel()));
        save_safetensors(rank_state_path(staging, r), rank_tensors, {{"state", texts[static_cast<size_t>(r)]}});
      }
    }, options.save_dtype);
  };
  // Periodic held-out figures on about the first eval_tokens tokens (all when 0), all of them at the end.
  auto add_heldout = [&](Json& record, int64_t limit) {
    const Json figures = batches->evaluate(model, limit);
    for (const auto& [name, value] : figures.items()) record[name] = value;
  };
  auto straggle = [&](double step_seconds) {
    if (world->rank() == options.straggle_rank)
      std::this_thread::sleep_for(std::chrono::duration<double>((options.straggle_factor - 1) * step_seconds));
  };
  auto print_progress = [&](Json& record, double loss, double lr, double grad_norm) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
    if (record.contains("val_loss")) {
      progress.set_heldout_loss(record["val_loss"].get<double>());
      std::string line = format_text("step %lld: held-out loss %.4f", static_cast<long long>(state.step),
                                 record["val_loss"].get<double>());
      if (record.contains("eval_rewards/accuracies"))
        line += format_text(", rewards/accuracies %.3f, rewards/margins %.3f", record["eval_rewards/accuracies"].get<double>(),
                        record["eval_rewards/margins"].get<double>());
      progress.event(line);
    }
    progress.update(progress_figures(record, loss, lr, grad_norm), elapsed);
  };
  auto crossed = [](int64_t before, int64_t after, int64_t every) { return every > 0 && after / every > before / every; };
  auto sync_record = [](const SyncReport& r) {
    return Json{{"dropped", r.dropped}, {"skipped_layers", r.skipped_layers}, {"pseudo_grad_norm", r.mean_norm},
                {"seconds", r.seconds}};
  };

  double last_loss = NAN;
  bool stopped = false, stopped_for_time = false;
  for (; state.stage < static_cast<int64_t>(recipe.stages.size()) && !stopped; ++state.stage) {
    const StageSettings& stage = recipe.stages[static_cast<size_t>(state.stage)];
    const bool resuming_this_stage = state.stage_step > 0 || state.data_cursor.position > 0 || state.data_cursor.epoch > 0;
    T = stage.seq;
    B = stage.batch;
    if (T > model.config().max_position_embeddings) {
      // RoPE has no table of positions: training on longer rows is what extends the context.
      progress.event(format_text("stage '%s': context extended from %lld to %lld positions", stage.name.c_str(),
                             static_cast<long long>(model.config().max_position_embeddings), static_cast<long long>(T)));
      model.extend_context(T);
    }
    if (stage.rope_theta > 0) model.set_rope_theta(stage.rope_theta);
    if (stage.aux_loss_coef >= 0 || stage.z_loss_coef >= 0)
      model.set_aux_loss_coefficients(stage.aux_loss_coef >= 0 ? stage.aux_loss_coef : model.config().aux_loss_coef,
                                      stage.z_loss_coef >= 0 ? stage.z_loss_coef : model.config().z_loss_coef);
    // Rank 0 prepares the stage's data first (it generates the embedded corpus if it is missing, and
    // caches DPO's reference log-probs); the others read what it made once it is complete.
    const uint64_t sampler_seed = stage_sampler_seed(recipe.seed, state.stage);
    auto prepare = [&]() {
      if (stage.kind == StageKind::Pretrain) {
        data = stage_data(stage, options, run_tokenizer, config.vocab_size, data);
        batches = window_batches(data.train, data.val, B, T, sampler_seed, world->rank(), world->size(),
                                 data.train_path + " (" + std::to_string(data.train.numel()) + " tokens)");
        return;
      }
      PostTrainingInputs inputs;
      inputs.tokenizer = run_tokenizer.tokenizer.get();
      inputs.tokenizer_json = run_tokenizer.json_text;
      inputs.cache_dir = options.out_dir + "/reference";
      inputs.seed = sampler_seed;
      inputs.rank = world->rank();
      inputs.world_size = world->size();
      inputs.progress = out;
      inputs.device = device;
      batches = post_training_batches(stage, inputs);
    };
    progress.finish();  // preparing a stage may print (skipped records, reference log-probs)
    if (lead) prepare();
    world->barrier();
    if (!lead) prepare();
    if (resuming_this_stage) batches->restore(state.data_cursor);
    stage_objective = batches->objective();
    trainer.set_objective(options.injections.empty() ? stage_objective : objective);
    // A fresh run starts with a checkpoint of its initial state (once its data has proved readable): the
    // guard always has one to go back to.
    if (state.step == 0 && options.resume.empty()) save();
    // A post-training stage starts from a trained model: its held-out figures before the first step are
    // the "before" of the stage (for DPO, at the reference: rewards 0).
    if (lead && stage.kind != StageKind::Pretrain && state.stage_step == 0 && options.eval_every > 0) {
      Json record = {{"step", state.step}, {"stage", stage.name}};
      add_heldout(record, options.eval_tokens);
      if (record.contains("val_loss")) {
        metrics.write(record);
        progress.event(format_text("step %lld: held-out loss %.4f before %s", static_cast<long long>(state.step),
                               record["val_loss"].get<double>(), stage_kind_name(stage.kind)));
      }
    }
    TrainerSettings& s = trainer.settings();
    s.schedule = stage.schedule();
    s.stage_total_tokens = stage.total_tokens() * world->size();
    s.clip = stage.clip;
    trainer.optimizer().settings().weight_decay = stage.weight_decay;
    if (state.step == first_step || recipe.stages.size() > 1)
      progress.event(format_text("%s%s: %.2fM parameters (%.2fM active per token); %s data %s; %d threads%s",
                             recipe.stages.size() > 1 ? ("stage " + stage.name + ", model ").c_str() : "model ",
                             config.name.c_str(), counts.total / 1e6, counts.active / 1e6, stage_kind_name(stage.kind),
                             batches->description().c_str(), num_threads(),
                             kernels::matmul_precision() == kernels::MatmulPrecision::BF16Inputs ? "; bf16 matmuls"
                                                                                                 : ""));

    std::vector<TokenBatch> micro_batches;
    auto train_one_step = [&]() {
      micro_batches.clear();
      const int64_t micro = stage.micro_batches_at(state.stage_step);
      for (int64_t i = 0; i < micro; ++i) micro_batches.push_back(batches->next());
      trainer.settings().lr_scale = guard.lr_factor(state.step);
      StepStats stats = trainer.step(micro_batches);
      straggle(stats.seconds);
      state.data_cursor = batches->cursor();
      if (stats.decision != UpdateDecision::Retry) ++steps_since_sync;
      if (verdict->action == SpikeGuard::Action::Reload) {
        // Non-finite steps in a row: back to the last checkpoint, at a lower learning rate, past the
        // data that led here.
        LT_CHECK(!edit_settings.time_based, "non-finite steps under --dist aedit (its replicas cannot reload ",
                 "together): resume from ", checkpoint_dir, " with a lower --lr");
        const SamplerCursor position = batches->cursor();
        const int64_t stage_now = state.stage;
        restore(checkpoint_dir, /*reloading=*/true);
        LT_CHECK(state.stage == stage_now, "non-finite steps right after a stage change: resume from ", checkpoint_dir,
                 " with a lower --lr");
        guard.reloaded();
        state.data_cursor = position;
        progress.event(format_text("step %lld: %lld non-finite steps in a row; reloaded %s, learning rate now x%g",
                               static_cast<long long>(state.step),
                               static_cast<long long>(options.spike_guard.bad_steps_to_reload), checkpoint_dir.c_str(),
                               guard.lr_factor(state.step)));
      }
      return stats;
    };
    // The guard's verdict in the metrics record and on the progress line, when it did anything.
    auto report_verdict = [&](Json& record) {
      if (!verdict || verdict->kind.empty()) return;
      record["spike"] = {{"kind", verdict->kind}, {"z", verdict->z}, {"action", SpikeGuard::action_name(verdict->action)}};
      progress.event(format_text("step %lld: %s spike (z %.1f): %s", static_cast<long long>(state.step),
                             verdict->kind.c_str(), verdict->z, SpikeGuard::action_name(verdict->action)));
    };

    // The steps every rank takes together: all of them under dp and edit; under aedit, the synchronous
    // warmup (the replicas average their gradients every step, so they cannot run at their own pace).
    const int64_t lockstep_end =
        !edit_settings.time_based
            ? stage.steps
            : std::clamp(edit_settings.local_sgd_warmup - (state.step - state.stage_step), int64_t{0}, stage.steps);
    while (state.stage_step < lockstep_end) {
      // The anchor is taken as local steps begin; a sync then follows every sync_interval-th step, so
      // evaluations and checkpoints at those steps see the synchronised model.
      if (edit && !edit->has_anchor() && state.step >= edit_settings.local_sgd_warmup) {
        edit->sync(0);
        steps_since_sync = 0;
      }
      StepStats stats = train_one_step();
      std::optional<SyncReport> synced;
      if (edit && edit->sync_due(state.step)) {
        synced = edit->sync(steps_since_sync);
        steps_since_sync = 0;
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      const bool time_up = lead && options.time_limit_seconds > 0 && elapsed > options.time_limit_seconds;
      // The ranks agree on the stop (rank 0's clock decides) in the same exchange as the statistics.
      const bool stop_for_time = share_step_statistics(data_parallel, stats, time_up);
      last_loss = stats.lm_loss;
      Json record = step_record(stats, state.tokens_seen);
      batches->add_step_metrics(stats, record);
      record["elapsed_s"] = elapsed;
      if (recipe.stages.size() > 1) record["stage"] = stage.name;
      if (synced) record["sync"] = sync_record(*synced);
      report_verdict(record);
      if (stats.decision == UpdateDecision::Retry) {  // the step is taken again on the next batch
        metrics.write(record);
        continue;
      }
      const bool last = state.step == total_steps;
      if (lead && options.eval_every > 0 && state.step % options.eval_every == 0 && !last)
        add_heldout(record, options.eval_tokens);
      metrics.write(record);
      print_progress(record, stats.lm_loss, stats.lr, stats.grad_norm);
      if (options.ckpt_every > 0 && state.step % options.ckpt_every == 0 && !last) save();
      if (stop_for_time && !last) {
        progress.event(format_text("time limit of %.0f s reached at step %lld", options.time_limit_seconds,
                               static_cast<long long>(state.step)));
        stopped = stopped_for_time = true;
      }
      if (options.stop_at_step > 0 && state.step >= options.stop_at_step && !last) {
        progress.event(format_text("stopping at step %lld as asked", static_cast<long long>(state.step)));
        stopped = true;
      }
      if (stopped) break;
    }
    if (!stopped && edit_settings.time_based && state.stage_step < stage.steps) {
      // A-EDiT: each replica steps at its own pace; the ranks meet only when a round ends (the timer
      // fired, or the replica used its share of the stage's remaining steps). The stage's budget is
      // stage.steps steps per replica in total, so it sees as many tokens as the other modes.
      const int R = edit->mesh().replicas(), me = edit->mesh().replica();
      const int64_t budget = stage.steps * R;
      const int64_t step_at_stage_start = state.step - state.stage_step;
      const int64_t tokens_at_stage_start = state.tokens_seen - state.stage_tokens;
      const int64_t tokens_per_replica_step = stage.batch * stage.seq * edit->mesh().shards();
      int64_t done = state.stage_step * R;  // replica-steps of this stage
      std::vector<double> share(static_cast<size_t>(R), 1.0 / R);
      auto quota_of_this_replica = [&]() {
        // The remaining replica-steps split by each replica's share of the last round's steps, the
        // rounding remainder to the lowest replicas: the quotas add up to exactly the budget.
        const int64_t remaining = budget - done;
        std::vector<int64_t> quotas(static_cast<size_t>(R));
        int64_t given = 0;
        for (int m = 0; m < R; ++m) given += quotas[static_cast<size_t>(m)] = static_cast<int64_t>(std::floor(remaining * share[static_cast<size_t>(m)]));
        for (int m = 0; given < remaining; m = (m + 1) % R, ++given) ++quotas[static_cast<size_t>(m)];
        return quotas[static_cast<size_t>(me)];
      };
      if (!edit->has_anchor()) {  // the replicas are still one model: the anchor
        edit->sync(0);
        steps_since_sync = 0;
      }
      int64_t quota = quota_of_this_replica(), round_steps = 0;
      double round_loss = 0;
      auto round_start = Clock::now();
      StepStats last;
      while (done < budget) {
        bool fired = round_steps >= quota ||
                     std::chrono::duration<double>(Clock::now() - round_start).count() >= edit_settings.sync_seconds;
        if (edit->mesh().shards() > 1) {  // the ranks of a replica step together, so they decide together
          Tensor any = Tensor::full({1}, fired ? 1.0 : 0.0, DType::F64);
          edit->mesh().shard_group->all_reduce(any, ReduceOp::Sum);
          fired = any.item() > 0;
        }
        if (!fired) {
          last = train_one_step();
          if (last.decision != UpdateDecision::Retry) {
            ++round_steps;
            round_loss += last.lm_loss;
          }
          continue;
        }
        // The round's end: every replica's steps (counted once, by its shard 0) and losses, and rank 0's
        // verdicts, in one exchange.
        const double round_seconds = std::chrono::duration<double>(Clock::now() - round_start).count();
        const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
        const bool counts_here = edit->mesh().shard() == 0;
        std::vector<double> values(static_cast<size_t>(2 * R + 3), 0.0);
        if (counts_here) {
          values[static_cast<size_t>(me)] = static_cast<double>(round_steps);
          values[static_cast<size_t>(R + me)] = static_cast<double>(steps_since_sync);
          values[static_cast<size_t>(2 * R)] = round_loss;
        }
        values[static_cast<size_t>(2 * R + 1)] = lead && options.time_limit_seconds > 0 && elapsed > options.time_limit_seconds;
        data_parallel.sum(values);
        int64_t round_total = 0, since_sync_total = 0;
        for (int m = 0; m < R; ++m) {
          round_total += static_cast<int64_t>(values[static_cast<size_t>(m)]);
          since_sync_total += static_cast<int64_t>(values[static_cast<size_t>(R + m)]);
        }
        done += round_total;
        const int64_t step_before = state.step;
        // The schedule follows the replicas' mean progress; every rank snaps to it here.
        state.stage_step = done / R;
        state.step = step_at_stage_start + state.stage_step;
        state.stage_tokens = done * tokens_per_replica_step;
        state.tokens_seen = tokens_at_stage_start + state.stage_tokens;
        const bool time_up = values[static_cast<size_t>(2 * R + 1)] > 0;
        const bool stop_here = options.stop_at_step > 0 && state.step >= options.stop_at_step;
        const bool final_round = done >= budget || time_up || stop_here;
        Json record = {{"step", state.step},
                       {"loss", round_total > 0 ? values[static_cast<size_t>(2 * R)] / static_cast<double>(round_total) : NAN},
                       {"lr", last.lr},
                       {"tokens", state.tokens_seen},
                       {"tokens_per_s", static_cast<double>(round_total * tokens_per_replica_step) / round_seconds},
                       {"round_seconds", round_seconds},
                       {"elapsed_s", elapsed}};
        std::vector<int64_t> per_replica;
        for (int m = 0; m < R; ++m) per_replica.push_back(static_cast<int64_t>(values[static_cast<size_t>(m)]));
        record["replica_steps"] = per_replica;
        if (since_sync_total >= edit_settings.min_total_steps || final_round) {
          record["sync"] = sync_record(edit->sync(steps_since_sync));
          steps_since_sync = 0;
        } else {
          record["sync"] = "skipped";
        }
        if (round_total > 0) {
          last_loss = record["loss"].get<double>();
          for (int m = 0; m < R; ++m) share[static_cast<size_t>(m)] = static_cast<double>(per_replica[static_cast<size_t>(m)]) / static_cast<double>(round_total);
        }
        const bool last_step = state.step >= total_steps;
        if (lead && crossed(step_before, state.step, options.eval_every) && !last_step)
          add_heldout(record, options.eval_tokens);
        metrics.write(record);
        if (round_total > 0) print_progress(record, last_loss, last.lr, last.grad_norm);
        if (crossed(step_before, state.step, options.ckpt_every) && !last_step && !final_round) save();
        if (time_up || stop_here) {
          progress.event(format_text("stopping at step %lld (%s)", static_cast<long long>(state.step),
                                 time_up ? "time limit" : "as asked"));
          stopped = true;
          break;
        }
        quota = quota_of_this_replica();
        round_steps = 0;
        round_loss = 0;
        round_start = Clock::now();
      }
    }
    if (stopped) break;
    if (state.stage + 1 < static_cast<int64_t>(recipe.stages.size())) {
      state.stage_step = 0;
      state.stage_tokens = 0;
      state.data_cursor = {};
    } else {
      break;  // the finished last stage stays the current one, so a resume with more steps extends it
    }
  }
  // A finished EDiT run (or one out of time) ends with a sync, so the checkpoint and the held-out loss
  // are of the one model every replica agrees on. A run stopped with --stop-at does not: its resume
  // must continue exactly as if it had never stopped.
  if (edit && (!stopped || stopped_for_time) && steps_since_sync > 0 && edit->mesh().replicas() > 1) {
    edit->sync(steps_since_sync);
    steps_since_sync = 0;
  }
  const double train_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  const int64_t steps_run = state.step - first_step;
  const double comm_bytes_per_step = static_cast<double>(bytes_sent()) / static_cast<double>(std::max<int64_t>(steps_run, 1));
  save();
  progress.finish();
  if (!lead) return Json();
  Json heldout = Json::object();
  add_heldout(heldout, 0);
  const StageSettings& last_stage = recipe.stages[static_cast<size_t>(std::min<int64_t>(state.stage, static_cast<int64_t>(recipe.stages.size()) - 1))];
  const double val = heldout.value("val_loss", NAN);
  if (!std::isnan(val))
    std::fprintf(out, "\nheld-out loss (all of %s): %.4f\n",
                 last_stage.kind == StageKind::Pretrain ? data.val_path.c_str() : last_stage.val.c_str(), val);
  double unigram = NAN;
  if (last_stage.kind == StageKind::Pretrain && data.val.defined())
    unigram = unigram_entropy_nats(read_token_shard(data.val_path), config.vocab_size);
  std::fprintf(out, "\ncheckpoint written to %s\n", checkpoint_dir.c_str());
  Json summary = {{"steps", state.step},
                  {"tokens", state.tokens_seen},
                  {"train_loss", last_loss},
                  {"val_loss", std::isnan(val) ? Json(nullptr) : Json(val)},
                  {"val_unigram_entropy", std::isnan(unigram) ? Json(nullptr) : Json(unigram)},
                  {"checkpoint", checkpoint_dir},
                  {"world_size", world->size()},
                  {"dist", options.dist},
                  {"wall_s", train_seconds},  // the training steps of this process, without the final eval
                  {"comm_bytes_per_step", comm_bytes_per_step}};  // sent by rank 0, per step of this run
  for (const auto& [name, value] : heldout.items())
    if (name != "val_loss") summary[name] = value;
  if (!options.sample_prompt.empty()) {
    SamplingSettings sampling;
    sampling.max_new_tokens = options.sample_tokens;
    sampling.seed = recipe.seed;
    summary["sample"] = sample_text(model, *run_tokenizer.tokenizer, options.sample_prompt, sampling);
  }
  return summary;
}

}  // namespace lt
