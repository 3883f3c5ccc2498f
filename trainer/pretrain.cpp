#include "trainer/pretrain.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <optional>

#include "data/corpus.h"
#include "tensor/derive_seed.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "io/metrics.h"
#include "model/config.h"
#include "trainer/checkpoint.h"
#include "trainer/evaluate.h"
#include "trainer/generate.h"
#include "trainer/trainer.h"
#include "tensor/threadpool.h"

namespace lt {

namespace {

using Clock = std::chrono::steady_clock;

const ByteTokenizer& byte_tokenizer() {
  static const ByteTokenizer tokenizer;
  return tokenizer;
}

// The embedded default corpus, generated into `dir` the first time it is needed.
constexpr uint64_t kDefaultCorpusSeed = 20250310;
std::string ensure_default_corpus(const std::string& dir, std::FILE* progress) {
  if (!std::filesystem::exists(dir + "/corpus.json")) {
    std::fprintf(progress, "generating the default corpus into %s ...\n", dir.c_str());
    std::filesystem::create_directories(dir);
    write_corpus_shards(dir, kDefaultCorpusSeed, kDefaultCorpusBytes, byte_tokenizer());
  }
  return dir;
}

// The first stage's batches come from the run's seed itself; a later stage's from a stream of it, so
// a stage that re-reads the same data does not repeat the first stage's order.
constexpr uint64_t kStageSamplerStream = 1000;
uint64_t stage_sampler_seed(uint64_t seed, int64_t stage) {
  return stage == 0 ? seed : derive_seed(seed, kStageSamplerStream + static_cast<uint64_t>(stage));
}

std::string format_duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char buffer[32];
  if (s >= 3600) std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else std::snprintf(buffer, sizeof buffer, "%ldm%02lds", s / 60, s % 60);
  return buffer;
}

// A stage's token arrays, read once and kept while consecutive stages name the same files.
struct StageData {
  std::string train_path, val_path;
  Tensor train, val;  // val undefined when the stage has no held-out file
};

StageData stage_data(const StageSettings& stage, const RunOptions& options, int64_t vocab, StageData previous) {
  std::string train_path = stage.data, val_path = stage.val;
  if (train_path.empty()) {
    const std::string corpus = ensure_default_corpus(options.out_dir + "/data", options.progress);
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
// token counts are already global). Returns whether any rank asked to stop.
bool share_step_statistics(DataParallel& dp, StepStats& stats, bool stop) {
  const int ranks = dp.comm().size();
  if (ranks == 1) return stop;
  std::vector<double> values = {stats.loss, stats.lm_loss, stats.aux_loss, stats.balance_loss, stats.z_loss,
                                stop ? 1.0 : 0.0};
  for (const LayerRouting& layer : stats.moe_layers) {
    values.push_back(layer.routing_entropy);
    values.insert(values.end(), layer.tokens_per_expert.begin(), layer.tokens_per_expert.end());
  }
  dp.sum(values);
  size_t i = 0;
  for (double* mean : {&stats.loss, &stats.lm_loss, &stats.aux_loss, &stats.balance_loss, &stats.z_loss})
    *mean = values[i++] / ranks;
  const bool any_stop = values[i++] > 0;
  for (LayerRouting& layer : stats.moe_layers) {
    layer.routing_entropy = values[i++] / ranks;
    for (int64_t& load : layer.tokens_per_expert) load = static_cast<int64_t>(values[i++]);
  }
  return any_stop;
}

}  // namespace

Json run_pretraining(const Recipe& requested, const RunOptions& options) {
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
    for (const auto& [key, value] : options.stage_overrides.items()) recipe_json["stages"][stage][key] = value;
    recipe = Recipe::from_json(recipe_json, source);
  }
  // Under mpirun every rank runs this function; rank 0 alone writes the metrics, the checkpoints and
  // the progress lines, and evaluates.
  LT_CHECK(options.dist == "dp", "unknown --dist '", options.dist, "' (dp)");
  LT_CHECK(options.straggle_factor >= 1, "--straggle: the factor must be >= 1, got ", options.straggle_factor);
  const std::unique_ptr<Communicator> world = make_world_communicator();
  DataParallel data_parallel(*world);
  const bool lead = world->rank() == 0;
  check_same_run_on_every_rank(*world, recipe.to_json().dump() + options.out_dir + options.resume);
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> silent(lead ? nullptr : std::fopen("/dev/null", "w"),
                                                                 &std::fclose);
  std::FILE* out = lead ? options.progress : silent.get();

  const LingConfig config =
      options.resume.empty() ? resolve_config(recipe.model) : load_checkpoint_config(options.resume);
  LingForCausalLM model(config, recipe.seed);
  if (!options.resume.empty()) load_checkpoint_weights(options.resume, model);

  TrainerSettings settings;
  settings.seed = recipe.seed;
  settings.routing_warmup_steps = recipe.routing_warmup;
  settings.rank = world->rank();
  settings.world_size = world->size();
  Trainer trainer(model, settings);
  trainer.hooks().after_backward = [&](FlatParameters& params) { data_parallel.average(params, model); };
  TrainState& state = trainer.state();
  if (!options.resume.empty()) {
    const std::string source = checkpoint_folder(options.resume) + "/trainer_state.json";
    train_state_from_json(saved_state.at("state"), source, state, model);
    load_checkpoint_optimizer(options.resume, trainer.optimizer());
  }

  if (lead) std::filesystem::create_directories(options.out_dir);
  MetricsLog metrics(!lead ? "" : options.metrics_path.empty() ? options.out_dir + "/metrics.jsonl" : options.metrics_path);
  const ParameterCount counts = count_parameters(config);
  const int64_t total_steps = recipe.total_steps();
  const bool interactive = lead && isatty(fileno(out));
  const auto run_start = Clock::now();
  const int64_t first_step = state.step;
  LT_CHECK(options.straggle_rank < world->size(), "--straggle: rank ", options.straggle_rank, " is outside the ",
           world->size(), " ranks");
  const std::string checkpoint_dir = options.out_dir + "/checkpoint";

  StageData data;
  int64_t T = 0, B = 0;  // of the current stage, set as it starts
  auto save = [&]() {
    if (!lead) return;
    const Json trainer_state = {{"state", train_state_to_json(state, model)}, {"recipe", recipe.to_json()}, {"seq_len", T}};
    save_checkpoint(checkpoint_dir, model, &trainer.optimizer(), trainer_state);
  };
  // Periodic held-out loss on the first eval_tokens tokens (all when 0); the whole file at the end.
  auto heldout_loss = [&](int64_t limit) -> double {
    if (!data.val.defined()) return NAN;
    const int64_t n = limit > 0 ? std::min(data.val.numel(), limit) : data.val.numel();
    return evaluate(model, data.val.narrow(0, n), T, B).mean();
  };

  double last_loss = NAN;
  bool stopped = false;
  for (; state.stage < static_cast<int64_t>(recipe.stages.size()) && !stopped; ++state.stage) {
    const StageSettings& stage = recipe.stages[static_cast<size_t>(state.stage)];
    const bool resuming_this_stage = state.stage_step > 0 || state.data_cursor.position > 0 || state.data_cursor.epoch > 0;
    T = stage.seq;
    B = stage.batch;
    LT_CHECK(T <= model.config().max_position_embeddings, "stage '", stage.name, "': seq ", T,
             " exceeds max_position_embeddings ", model.config().max_position_embeddings, " of the model");
    if (stage.rope_theta > 0) model.set_rope_theta(stage.rope_theta);
    // Rank 0 generates the embedded corpus if it is missing; the others read it once it is complete.
    if (lead) data = stage_data(stage, options, config.vocab_size, data);
    world->barrier();
    if (!lead) data = stage_data(stage, options, config.vocab_size, data);
    BatchSampler sampler(data.train, B, T, stage_sampler_seed(recipe.seed, state.stage), world->rank(), world->size());
    if (resuming_this_stage) sampler.restore(state.data_cursor);
    TrainerSettings& s = trainer.settings();
    s.schedule = stage.schedule;
    s.stage_total_tokens = stage.total_tokens() * world->size();
    s.clip = stage.clip;
    trainer.optimizer().settings().weight_decay = stage.weight_decay;
    if (state.step == first_step || recipe.stages.size() > 1)
      std::fprintf(out, "%s%s: %.2fM parameters (%.2fM active per token); data %s (%lld tokens); %d threads\n",
                   recipe.stages.size() > 1 ? ("stage " + stage.name + ", model ").c_str() : "model ",
                   config.name.c_str(), counts.total / 1e6, counts.active / 1e6, data.train_path.c_str(),
                   static_cast<long long>(data.train.numel()), num_threads());

    std::vector<TokenBatch> micro_batches;
    while (state.stage_step < stage.steps) {
      micro_batches.clear();
      const int64_t micro = stage.micro_batches_at(state.stage_step);
      for (int64_t i = 0; i < micro; ++i) micro_batches.push_back(sampler.next());
      StepStats stats = trainer.step(micro_batches);
      if (world->rank() == options.straggle_rank)
        std::this_thread::sleep_for(std::chrono::duration<double>((options.straggle_factor - 1) * stats.seconds));
      state.data_cursor = sampler.cursor();
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      const bool time_up = lead && options.time_limit_seconds > 0 && elapsed > options.time_limit_seconds;
      // The ranks agree on the stop (rank 0's clock decides) in the same exchange as the statistics.
      const bool stop_for_time = share_step_statistics(data_parallel, stats, time_up);
      last_loss = stats.lm_loss;
      const double eta =
          elapsed / static_cast<double>(std::max<int64_t>(state.step - first_step, 1)) *
          static_cast<double>(total_steps - state.step);
      Json record = step_record(stats, state.tokens_seen);
      if (recipe.stages.size() > 1) record["stage"] = stage.name;
      const bool last = state.step == total_steps;
      if (lead && options.eval_every > 0 && state.step % options.eval_every == 0 && !last) {
        const double val = heldout_loss(options.eval_tokens);
        if (!std::isnan(val)) record["val_loss"] = val;
      }
      metrics.write(record);
      std::fprintf(out, "%sstep %lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.0f tok/s | ETA %s%s",
                   interactive ? "\r" : "", static_cast<long long>(state.step), static_cast<long long>(total_steps),
                   stats.lm_loss, stats.lr, stats.grad_norm, record["tokens_per_s"].get<double>(),
                   format_duration(eta).c_str(), interactive ? "   " : "\n");
      if (record.contains("val_loss"))
        std::fprintf(out, "%sstep %lld: held-out loss %.4f\n", interactive ? "\n" : "",
                     static_cast<long long>(state.step), record["val_loss"].get<double>());
      if (options.ckpt_every > 0 && state.step % options.ckpt_every == 0 && !last) save();
      if (stop_for_time && !last) {
        std::fprintf(out, "\ntime limit of %.0f s reached at step %lld\n", options.time_limit_seconds,
                     static_cast<long long>(state.step));
        stopped = true;
      }
      if (options.stop_at_step > 0 && state.step >= options.stop_at_step && !last) {
        std::fprintf(out, "\nstopping at step %lld as asked\n", static_cast<long long>(state.step));
        stopped = true;
      }
      if (stopped) break;
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
  const double train_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  save();
  if (!lead) return Json();
  const double val = heldout_loss(0);
  if (!std::isnan(val)) std::fprintf(out, "\nheld-out loss (whole %s): %.4f\n", data.val_path.c_str(), val);
  double unigram = NAN;
  if (data.val.defined()) unigram = unigram_entropy_nats(read_token_shard(data.val_path), config.vocab_size);
  std::fprintf(out, "\ncheckpoint written to %s\n", checkpoint_dir.c_str());
  Json summary = {{"steps", state.step},
                  {"tokens", state.tokens_seen},
                  {"train_loss", last_loss},
                  {"val_loss", std::isnan(val) ? Json(nullptr) : Json(val)},
                  {"val_unigram_entropy", std::isnan(unigram) ? Json(nullptr) : Json(unigram)},
                  {"checkpoint", checkpoint_dir},
                  {"world_size", world->size()},
                  {"wall_s", train_seconds}};  // the training steps of this process, without the final eval
  if (!options.sample_prompt.empty()) {
    SamplingSettings sampling;
    sampling.max_new_tokens = options.sample_tokens;
    sampling.seed = recipe.seed;
    summary["sample"] = sample_text(model, byte_tokenizer(), options.sample_prompt, sampling);
  }
  return summary;
}

}  // namespace lt
