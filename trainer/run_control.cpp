#include "trainer/run_control.h"

#include <thread>

#include "dist/watchdog.h"
#include "io/format_text.h"
#include "model/config.h"
#include "tensor/threadpool.h"

namespace lt {

RunControl::RunControl(RunSetup& setup, Trainer& trainer, SpikeGuard& guard, Checkpointer& checkpointer,
                       MetricsSink& sink, Evaluator& evaluator, FaultInjector& faults, Communicator& agreeing,
                       bool can_reload)
    : setup_(setup), trainer_(trainer), guard_(guard), checkpointer_(checkpointer), sink_(sink), evaluator_(evaluator),
      faults_(faults), can_reload_(can_reload), total_steps_(setup.recipe().total_steps()),
      first_step_(trainer.state().step), profiler_(setup.world(), setup.options().profile_every) {
  if (setup.world().size() > 1) slow_ranks_.emplace(setup.world(), setup.options().slow_rank_factor);
  trainer_.hooks().before_update = [this, &agreeing](const StepStats& stats) {
    Tensor observed = Tensor::from_vector<double>({2}, {stats.loss, stats.grad_norm});
    if (agreeing.size() > 1) agreeing.all_reduce(observed, ReduceOp::Mean);
    const std::vector<double> mean = observed.to_vector<double>();
    faults_.attempt_judged(state().step);
    verdict_ = guard_.judge(state().step, mean[0], mean[1]);
    const bool update = verdict_->action == SpikeGuard::Action::Apply || verdict_->action == SpikeGuard::Action::Accept;
    return update ? UpdateDecision::Apply : UpdateDecision::Retry;
  };
}

void RunControl::begin_stage() {
  TrainState& s = state();
  const Recipe& recipe = setup_.recipe();
  const StageSettings& stage = *(stage_ = &recipe.stages[static_cast<size_t>(s.stage)]);
  LingForCausalLM& model = setup_.model();
  const bool resuming_this_stage = s.stage_step > 0 || !at_start(s.data_cursor);
  if (stage.seq > model.config().max_position_embeddings) {
    // RoPE has no table of positions: training on longer rows is what extends the context.
    sink_.event(format_text("stage '%s': context extended from %lld to %lld positions", stage.name.c_str(),
                            static_cast<long long>(model.config().max_position_embeddings),
                            static_cast<long long>(stage.seq)));
    model.extend_context(stage.seq);
  }
  if (stage.rope_theta > 0) model.set_rope_theta(stage.rope_theta);
  if (stage.aux_loss_coef >= 0 || stage.z_loss_coef >= 0)
    model.set_aux_loss_coefficients(stage.aux_loss_coef >= 0 ? stage.aux_loss_coef : model.config().aux_loss_coef,
                                    stage.z_loss_coef >= 0 ? stage.z_loss_coef : model.config().z_loss_coef);
  sink_.finish();  // preparing a stage may print (skipped records, reference log-probs)
  batches_ = setup_.stage_batches(s.stage);
  if (resuming_this_stage) batches_->restore(s.data_cursor);
  if (const std::string note = setup_.stage_note(s.stage); !note.empty() && !resuming_this_stage) sink_.event(note);
  trainer_.set_objective(faults_.wrap(batches_->objective()));
  // A fresh run starts with a checkpoint of its initial state (once its data has proved readable): the
  // guard always has one to go back to.
  if (s.step == 0 && !setup_.resuming()) checkpointer_.save(stage.seq);
  // A post-training stage starts from a trained model: its held-out figures before the first step are
  // the "before" of the stage (for DPO, at the reference: rewards 0).
  if (evaluator_.periodic() && stage.kind != StageKind::Pretrain && s.stage_step == 0) {
    Json record = {{"step", s.step}, {"stage", stage.name}};
    evaluator_.add_periodic(*batches_, record);
    evaluator_.add_multiple_choice(record);
    if (record.contains("val_loss") || record.contains("mc_acc")) {
      sink_.write(record);
      std::string line = format_text("step %lld:", static_cast<long long>(s.step));
      if (record.contains("val_loss")) line += format_text(" held-out loss %.4f", record["val_loss"].get<double>());
      if (record.contains("mc_acc"))
        line += format_text("%s multiple-choice acc %.4f", record.contains("val_loss") ? "," : "",
                            record["mc_acc"].get<double>());
      sink_.event(line + " before " + stage_kind_name(stage.kind));
    }
  }
  TrainerSettings& settings = trainer_.settings();
  settings.schedule = stage.schedule();
  settings.stage_total_tokens = stage.total_tokens() * setup_.world().size();
  settings.clip = stage.clip;
  trainer_.optimizer().settings().weight_decay = stage.weight_decay;
  if (s.step == first_step_ || recipe.stages.size() > 1) {
    const ParameterCount counts = count_parameters(model.config());
    const kernels::MatmulPrecision matmuls = kernels::matmul_precision();
    const std::string precision = matmuls == kernels::MatmulPrecision::F32
                                      ? ""
                                      : format_text("; %s matmuls", kernels::matmul_precision_name(matmuls));
    const std::string vocab = setup_.model_note().empty() ? "" : "; " + setup_.model_note();
    sink_.event(format_text("%s%s: %.2fM parameters (%.2fM active per token)%s; %s data %s; %s%s",
                            recipe.stages.size() > 1 ? ("stage " + stage.name + ", model ").c_str() : "model ",
                            model.config().name.c_str(), counts.total / 1e6, counts.active / 1e6, vocab.c_str(),
                            stage_kind_name(stage.kind),
                            batches_->description().c_str(), count_of(num_threads(), "thread").c_str(),
                            precision.c_str()));
  }
}

StepStats RunControl::train_step() {
  TrainState& s = state();
  micro_batches_.clear();
  const int64_t micro = stage_->micro_batches_at(s.stage_step);
  for (int64_t i = 0; i < micro; ++i) micro_batches_.push_back(batches_->next());
  trainer_.settings().lr_scale = guard_.lr_factor(s.step);
  StepStats stats;
  {
    const WatchedStep watch(s.step);
    profiler_.begin(s.step + 1);
    stats = trainer_.step(micro_batches_);
    profiler_.end();
  }
  straggle(stats.seconds);
  if (slow_ranks_) slow_ranks_->add_step(stats);
  s.data_cursor = batches_->cursor();
  if (verdict_->action == SpikeGuard::Action::Reload) {
    // Non-finite steps in a row: back to the last checkpoint, at a lower learning rate, past the data
    // that led here.
    const std::string dir = checkpointer_.reload_dir();
    LT_CHECK(can_reload_, "non-finite steps under --dist aedit (its replicas cannot reload together): resume from ",
             dir, " with a lower --lr");
    const DataCursor position = batches_->cursor();
    const int64_t stage_now = s.stage;
    {
      const SharedCheckpoint shared(setup_.world(), dir);  // rank 0's, on every rank
      checkpointer_.restore(shared.folder(), /*reloading=*/true);
    }
    LT_CHECK(s.stage == stage_now, "non-finite steps right after a stage change: resume from ", dir, " with a lower --lr");
    guard_.reloaded();
    s.data_cursor = position;
    sink_.event(format_text("step %lld: %lld non-finite steps in a row; reloaded %s, learning rate now x%g",
                            static_cast<long long>(s.step),
                            static_cast<long long>(setup_.options().spike_guard.bad_steps_to_reload), dir.c_str(),
                            guard_.lr_factor(s.step)));
  }
  return stats;
}

Json RunControl::step_record(const StepStats& stats) {
  Json record = lt::step_record(stats, state().tokens_seen);
  batches_->add_step_metrics(stats, record);
  record["elapsed_s"] = elapsed();
  if (setup_.recipe().stages.size() > 1) record["stage"] = stage_->name;
  // The guard's verdict in the record and on the progress line, when it did anything.
  if (verdict_ && !verdict_->kind.empty()) {
    record["spike"] = {{"kind", verdict_->kind}, {"z", verdict_->z}, {"action", SpikeGuard::action_name(verdict_->action)}};
    sink_.event(format_text("step %lld: %s spike (z %.1f): %s", static_cast<long long>(state().step),
                            verdict_->kind.c_str(), verdict_->z, SpikeGuard::action_name(verdict_->action)));
  }
  return record;
}

double RunControl::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

bool RunControl::time_up() const {
  const double limit = setup_.options().time_limit_seconds;
  return setup_.lead() && limit > 0 && elapsed() > limit;
}

bool RunControl::stop_asked_at(int64_t step) const {
  const int64_t stop_at = setup_.options().stop_at_step;
  return stop_at > 0 && step >= stop_at;
}

bool RunControl::conclude(int64_t step_before, Json& record, std::optional<Shown> shown, bool time_up) {
  const int64_t step = state().step;
  const bool last = step >= total_steps_;
  if (slow_ranks_) slow_ranks_->end_interval();
  if (evaluator_.due(step_before, step) && !last) evaluator_.add_periodic(*batches_, record);
  if (evaluator_.multiple_choice_due(step_before, step) && !last) evaluator_.add_multiple_choice(record);
  if (slow_ranks_)
    for (const std::string& line : slow_ranks_->at_log_point(record)) sink_.event(line);
  profiler_.at_log_point(step_before, step, record);
  sink_.write(record);
  if (shown) sink_.show(record, shown->loss, shown->lr, shown->grad_norm, elapsed());
  if (!last && time_up) stop_ = Stop::TimeLimit;
  else if (!last && stop_asked_at(step)) stop_ = Stop::Asked;
  // A stopping run writes its checkpoint once, at its end.
  const int64_t every = setup_.options().ckpt_every;
  if (every > 0 && step / every > step_before / every && !last && stop_ == Stop::None) checkpointer_.save(stage_->seq);
  if (stop_ == Stop::TimeLimit)
    sink_.event(format_text("time limit of %.0f s reached at step %lld", setup_.options().time_limit_seconds,
                            static_cast<long long>(step)));
  if (stop_ == Stop::Asked) sink_.event(format_text("stopping at step %lld as asked", static_cast<long long>(step)));
  if (slow_ranks_) slow_ranks_->begin_interval();
  return stop_ != Stop::None;
}

void RunControl::straggle(double step_seconds) const {
  const RunOptions& options = setup_.options();
  if (setup_.world().rank() == options.straggle_rank)
    std::this_thread::sleep_for(std::chrono::duration<double>((options.straggle_factor - 1) * step_seconds));
}

}  // namespace lt
