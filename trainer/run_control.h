// What a distribution strategy's loop calls (trainer/strategy.h), written once for every strategy:
// the start of a stage, one training step under the spike guard, and the decisions after a step or an
// A-EDiT round (held-out figures, the metrics record, the progress line, a checkpoint, the stop).
#pragma once
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "optim/spike_guard.h"
#include "trainer/checkpointer.h"
#include "trainer/evaluator.h"
#include "trainer/fault_injection.h"
#include "trainer/metrics_sink.h"
#include "trainer/run_setup.h"
#include "trainer/slow_ranks.h"
#include "trainer/step_profiler.h"
#include "trainer/trainer.h"

namespace lt {

class RunControl {
 public:
  // Why a run stopped before the end of its recipe.
  enum class Stop { None, TimeLimit, Asked };

  // Installs the spike guard on the trainer; `agreeing`: the ranks whose guards decide together (their
  // inputs are averaged over them). can_reload: whether the run can go back to its last checkpoint
  // after non-finite steps (every rank must go back together).
  RunControl(RunSetup& setup, Trainer& trainer, SpikeGuard& guard, Checkpointer& checkpointer, MetricsSink& sink,
             Evaluator& evaluator, FaultInjector& faults, Communicator& agreeing, bool can_reload);

  // The state's current stage begins (or resumes): the model's context and RoPE, its data, objective,
  // schedule and optimiser settings; a fresh run's first checkpoint; a post-training stage's held-out
  // figures before its first step.
  void begin_stage();
  const StageSettings& stage() const { return *stage_; }
  StageBatches& batches() { return *batches_; }

  // One step of the current stage under the spike guard (a Reload verdict goes back to the last
  // checkpoint here, past the data that led to it). A step whose decision is Retry did not count.
  StepStats train_step();
  // The metrics record of a step: its figures, the stage's own, the time, and the guard's verdict.
  Json step_record(const StepStats& stats);

  // Whether rank 0's clock passed --time-limit (rank 0 decides; the strategies share its word), and
  // whether --stop-at asks to stop at `step`.
  bool time_up() const;
  bool stop_asked_at(int64_t step) const;
  // After the run moved from step_before to the state's step (one step, or an A-EDiT round): the
  // held-out figures when an --eval-every point was passed, the record, the progress line (`shown`:
  // the loss, lr and gradient norm to show; none for a round without steps), a checkpoint when a
  // --ckpt-every point was passed, and the stop (for the time limit when time_up, or as --stop-at asks;
  // never at the run's last step). Returns whether the run stops here.
  struct Shown {
    double loss, lr, grad_norm;
  };
  bool conclude(int64_t step_before, Json& record, std::optional<Shown> shown, bool time_up);
  Stop stopped() const { return stop_; }
  // The last training loss the run showed (a step's, or an A-EDiT round's mean), for its summary.
  void note_train_loss(double loss) { train_loss_ = loss; }
  double train_loss() const { return train_loss_; }

  double elapsed() const;
  TrainState& state() { return trainer_.state(); }
  Trainer& trainer() { return trainer_; }
  int64_t first_step() const { return first_step_; }
  RunSetup& setup() { return setup_; }
  Checkpointer& checkpointer() { return checkpointer_; }
  MetricsSink& sink() { return sink_; }
  Evaluator& evaluator() { return evaluator_; }

 private:
  void straggle(double step_seconds) const;

  RunSetup& setup_;
  Trainer& trainer_;
  SpikeGuard& guard_;
  Checkpointer& checkpointer_;
  MetricsSink& sink_;
  Evaluator& evaluator_;
  FaultInjector& faults_;
  bool can_reload_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const int64_t total_steps_, first_step_;
  const StageSettings* stage_ = nullptr;
  std::unique_ptr<StageBatches> batches_;
  std::vector<TokenBatch> micro_batches_;
  std::optional<SpikeGuard::Verdict> verdict_;  // of the last step
  std::optional<SlowRanks> slow_ranks_;         // under several ranks
  StepProfiler profiler_;
  Stop stop_ = Stop::None;
  double train_loss_ = NAN;
};

}  // namespace lt
