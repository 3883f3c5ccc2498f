#include "trainer/run.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "data/corpus.h"
#include "data/shard.h"
#include "dist/communicator.h"
#include "dist/watchdog.h"
#include "io/format_text.h"
#include "trainer/generate.h"
#include "trainer/strategy.h"

namespace lt {

DistMode parse_dist_mode(const std::string& name) {
  if (name == "dp") return DistMode::DataParallel;
  if (name == "edit") return DistMode::Edit;
  if (name == "aedit") return DistMode::AEdit;
  fail("unknown --dist '", name, "' (dp, edit, aedit)");
}

const char* dist_mode_name(DistMode mode) {
  switch (mode) {
    case DistMode::DataParallel: return "dp";
    case DistMode::Edit: return "edit";
    case DistMode::AEdit: return "aedit";
  }
  return "dp";
}

namespace {

// What this rank holds of the training state, in bytes: the flat weights and gradients, the AdamW moments
// of its shard (trainer/trainer.h), and of them the routed experts' part (a slice of them under expert
// parallelism, its part of each layer under parameter sharding).
Json rank_state_bytes(Trainer& trainer) {
  const FlatParameters& params = trainer.parameters();
  const FlatParameters::Range owned = trainer.optimizer().owned();
  const auto element = static_cast<int64_t>(dtype_size(params.values().dtype()));
  int64_t experts = 0, expert_moments = 0;
  for (const FlatParameters::Range& r : routed_expert_ranges(params)) {
    const int64_t held = params.held_elements(r);
    experts += held;
    // ZeRO-2's optimiser shard (EDiT) cuts the whole layout; under parameter sharding it owns all that is held.
    expert_moments += params.sharded_by_layer()
                          ? held
                          : std::max<int64_t>(0, std::min(r.end, owned.end) - std::max(r.begin, owned.begin));
  }
  return {{"weights", element * params.numel()},
          {"gradients", element * params.grads().numel()},
          {"adamw", 2 * element * owned.size()},
          {"routed_experts", element * (2 * experts + 2 * expert_moments)}};
}

// The sample at the end of a run, within the model's positions (the prompt's included); none, with a
// note, when the prompt alone fills them.
void add_sample(RunSetup& setup, Json& summary) {
  const RunOptions& options = setup.options();
  if (options.sample_prompt.empty()) return;
  LingForCausalLM& model = setup.model();
  const Tokenizer& tokenizer = *setup.tokenizer().tokenizer;
  const int64_t positions = model.config().max_position_embeddings;
  const int64_t room = positions - sample_prompt_tokens(tokenizer, options.sample_prompt);
  if (room <= 0) {
    std::fprintf(setup.out(), "no sample: the prompt fills the model's %lld positions\n", static_cast<long long>(positions));
    return;
  }
  SamplingSettings sampling;
  sampling.max_new_tokens = std::min(options.sample_tokens, room);
  sampling.seed = setup.recipe().seed;
  if (sampling.max_new_tokens < options.sample_tokens)
    std::fprintf(setup.out(), "sample: %lld tokens, as many as the model's %lld positions leave after the prompt\n",
                 static_cast<long long>(sampling.max_new_tokens), static_cast<long long>(positions));
  summary["sample"] = sample_texts(model, tokenizer, options.sample_prompt, sampling, 1)[0];
}

// The end of the run on the ranks that evaluate (RunSetup::evaluates): the held-out figures over all of the
// held-out data (into the metrics too, as the run's last record), the checkpoint, and the summary.
Json summarise(RunControl& run, double train_seconds, double comm_bytes_per_step) {
  RunSetup& setup = run.setup();
  const TrainState& state = run.state();
  const Json heldout = run.evaluator().all(run.batches());
  if (!heldout.empty()) {
    Json record = heldout;
    record["step"] = state.step;
    record["heldout"] = "end";
    run.sink().write(record);
  }
  const double val = heldout.value("val_loss", std::nan(""));
  const std::string val_path = setup.heldout_path(state.stage);
  if (!std::isnan(val)) {
    std::string covered = val_path;
    if (heldout.contains("val_conversations"))
      covered += ", " + count_of(heldout["val_conversations"].get<int64_t>(), "conversation");
    std::fprintf(setup.out(), "\nheld-out loss (all of %s): %.4f\n", covered.c_str(), val);
  }
  if (heldout.contains("mc_acc"))
    std::fprintf(setup.out(), "multiple-choice accuracy (%s of %s): acc %.4f, acc_norm %.4f (chance %.4f)\n",
                 count_of(heldout["mc_items"].get<int64_t>(), "item").c_str(), setup.options().eval_mc.c_str(),
                 heldout["mc_acc"].get<double>(), heldout["mc_acc_norm"].get<double>(),
                 heldout["mc_chance"].get<double>());
  double unigram = NAN;
  if (run.stage().kind == StageKind::Pretrain && !val_path.empty())
    unigram = unigram_entropy_nats(TokenShards::open(val_path, setup.model().config().vocab_size),
                                   setup.model().config().vocab_size);
  std::fprintf(setup.out(), "\ncheckpoint written to %s\n", run.checkpointer().dir().c_str());
  Json summary = {{"steps", state.step},
                  {"tokens", state.tokens_seen},
                  {"train_loss", run.train_loss()},
                  {"val_loss", std::isnan(val) ? Json(nullptr) : Json(val)},
                  {"val_unigram_entropy", std::isnan(unigram) ? Json(nullptr) : Json(unigram)},
                  {"checkpoint", run.checkpointer().dir()},
                  {"world_size", setup.world().size()},
                  {"dist", dist_mode_name(setup.dist())},
                  {"wall_s", train_seconds},  // the training steps of this process, without the final eval
                  {"comm_bytes_per_step", comm_bytes_per_step},  // sent by rank 0, per step of this run
                  {"expert_parallel", setup.expert_parallel()},
                  {"shard_params", setup.shard_params()},
                  {"rank_state_bytes", rank_state_bytes(run.trainer())}};  // rank 0's
  for (const auto& [name, value] : heldout.items())
    if (name != "val_loss" && name != "val_conversations") summary[name] = value;
  add_sample(setup, summary);
  return summary;
}

}  // namespace

Json run_training(const Recipe& requested, const RunOptions& options) {
  const HangWatchdog watchdog(options.collective_timeout_seconds, process_rank());
  RunSetup setup(requested, options);
  const std::unique_ptr<DistributionStrategy> strategy = make_strategy(setup);
  TrainerSettings settings;
  settings.seed = setup.recipe().seed;
  settings.routing_warmup_steps = setup.recipe().routing_warmup;
  settings.rank = setup.world().rank();
  settings.world_size = setup.world().size();
  strategy->configure(settings);
  Trainer trainer(setup.model(), settings);
  strategy->attach(trainer);
  SpikeGuard guard(options.spike_guard);
  Checkpointer checkpointer(setup, trainer, guard, strategy->rank_state(), strategy->parameter_shards());
  if (setup.resuming()) checkpointer.restore(setup.resume_folder(), /*reloading=*/false);

  TrainState& state = trainer.state();
  const std::string metrics_path = options.metrics_path.empty() ? options.out_dir + "/metrics.jsonl" : options.metrics_path;
  if (setup.lead()) std::filesystem::create_directories(options.out_dir);
  MetricsSink sink(setup.out(), setup.lead(), setup.lead() ? metrics_path : "", setup.resuming() ? state.step : -1,
                   setup.recipe().total_steps(), state.step);
  Evaluator evaluator(setup.model(), setup.evaluates(), options.eval_every, options.eval_tokens,
                      {&setup.multiple_choice_items(), setup.tokenizer().tokenizer.get(), options.eval_mc_every});
  FaultInjector faults(options.injections, setup.world().rank());
  RunControl run(setup, trainer, guard, checkpointer, sink, evaluator, faults, strategy->agreeing(),
                 strategy->can_reload());

  // The stages in order; the finished last stage stays the current one, so a resume with more steps
  // extends it.
  const int64_t stages = static_cast<int64_t>(setup.recipe().stages.size());
  for (;;) {
    run.begin_stage();
    strategy->run_stage(run);
    if (run.stopped() != RunControl::Stop::None || state.stage + 1 >= stages) break;
    ++state.stage;
    state.stage_step = 0;
    state.stage_tokens = 0;
    state.data_cursor = {};
  }
  strategy->finish(run);
  const double train_seconds = run.elapsed();
  const int64_t steps_run = std::max<int64_t>(state.step - run.first_step(), 1);
  const double comm_bytes_per_step = static_cast<double>(strategy->bytes_sent()) / static_cast<double>(steps_run);
  checkpointer.save(run.stage().seq);
  checkpointer.wait();
  sink.finish();
  // The ranks that evaluate all take the final figures and the sample (under expert parallelism each
  // forward is collective over rank 0's group); rank 0 reports.
  const Json summary = setup.evaluates() ? summarise(run, train_seconds, comm_bytes_per_step) : Json();
  return setup.lead() ? summary : Json();
}

}  // namespace lt
