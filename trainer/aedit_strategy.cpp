// A-EDiT's loop: the synchronous warmup in lockstep, then rounds. In a round each replica steps at its
// own pace; the ranks meet only when the round ends (the timer fired, or the replica used its share of
// the stage's remaining steps). The stage's budget is stage.steps steps per replica in total, so it
// sees as many tokens as the other modes. --eval-every and --ckpt-every points that fall inside a round
// are taken at its end.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "trainer/edit_strategy.h"

namespace lt {

void AEditStrategy::run_stage(RunControl& run) {
  // The replicas average their gradients every step of the warmup, so they cannot run at their own pace.
  const TrainState& state = run.state();
  const int64_t steps = run.stage().steps;
  const int64_t lockstep_end =
      std::clamp(setup_.edit().local_sgd_warmup - (state.step - state.stage_step), int64_t{0}, steps);
  if (run_lockstep(run, lockstep_end)) return;
  if (state.stage_step < steps) run_rounds(run);
}

void AEditStrategy::run_rounds(RunControl& run) {
  using Clock = std::chrono::steady_clock;
  TrainState& state = run.state();
  const StageSettings& stage = run.stage();
  const EditMesh& mesh = edit_->mesh();
  const int R = mesh.replicas(), me = mesh.replica();
  const int64_t budget = stage.steps * R;
  const int64_t step_at_stage_start = state.step - state.stage_step;
  const int64_t tokens_at_stage_start = state.tokens_seen - state.stage_tokens;
  Communicator& replica = mesh.replica_group();
  const int64_t tokens_per_replica_step = stage.batch * stage.seq * replica.size();
  int64_t done = state.stage_step * R;  // replica-steps of this stage
  std::vector<double> share(static_cast<size_t>(R), 1.0 / R);
  auto quota_of_this_replica = [&]() {
    // The remaining replica-steps split by each replica's share of the last round's steps, the
    // rounding remainder to the lowest replicas: the quotas add up to exactly the budget.
    const int64_t remaining = budget - done;
    std::vector<int64_t> quotas(static_cast<size_t>(R));
    int64_t given = 0;
    for (int m = 0; m < R; ++m)
      given += quotas[static_cast<size_t>(m)] = static_cast<int64_t>(std::floor(remaining * share[static_cast<size_t>(m)]));
    for (int m = 0; given < remaining; m = (m + 1) % R, ++given) ++quotas[static_cast<size_t>(m)];
    return quotas[static_cast<size_t>(me)];
  };
  if (!edit_->has_anchor()) {  // the replicas are still one model: the anchor
    edit_->sync(0);
    steps_since_sync_ = 0;
  }
  // The step every rank agrees on as a round starts; within the round each replica's own count runs ahead.
  int64_t round_first_step = state.step;
  int64_t quota = quota_of_this_replica(), round_steps = 0;
  double round_loss = 0;
  auto round_start = Clock::now();
  StepStats last;
  while (done < budget) {
    bool fired = round_steps >= quota ||
                 std::chrono::duration<double>(Clock::now() - round_start).count() >= setup_.edit().sync_seconds;
    if (replica.size() > 1) {  // the ranks of a replica step together, so they decide together
      Tensor any = Tensor::full({1}, fired ? 1.0 : 0.0, DType::F64);
      replica.all_reduce(any, ReduceOp::Sum);
      fired = any.item() > 0;
    }
    if (!fired) {
      last = run.train_step();
      if (last.decision != UpdateDecision::Retry) {
        ++steps_since_sync_;
        ++round_steps;
        round_loss += last.lm_loss;
      }
      continue;
    }
    // The round's end: every replica's steps (counted once, by its first rank) and losses, and rank 0's
    // word on the time limit, in one exchange.
    const double round_seconds = std::chrono::duration<double>(Clock::now() - round_start).count();
    const bool counts_here = replica.rank() == 0;
    std::vector<double> values(static_cast<size_t>(2 * R + 3), 0.0);
    if (counts_here) {
      values[static_cast<size_t>(me)] = static_cast<double>(round_steps);
      values[static_cast<size_t>(R + me)] = static_cast<double>(steps_since_sync_);
      values[static_cast<size_t>(2 * R)] = round_loss;
    }
    values[static_cast<size_t>(2 * R + 1)] = run.time_up();
    data_parallel_.sum(values);
    int64_t round_total = 0, since_sync_total = 0;
    std::vector<int64_t> per_replica;
    for (int m = 0; m < R; ++m) {
      per_replica.push_back(static_cast<int64_t>(values[static_cast<size_t>(m)]));
      round_total += per_replica.back();
      since_sync_total += static_cast<int64_t>(values[static_cast<size_t>(R + m)]);
    }
    done += round_total;
    // The schedule follows the replicas' mean progress; every rank snaps to it here.
    state.stage_step = done / R;
    state.step = step_at_stage_start + state.stage_step;
    state.stage_tokens = done * tokens_per_replica_step;
    state.tokens_seen = tokens_at_stage_start + state.stage_tokens;
    const bool time_up = values[static_cast<size_t>(2 * R + 1)] > 0;
    const bool final_round = done >= budget || time_up || run.stop_asked_at(state.step);
    const double mean_loss = round_total > 0 ? values[static_cast<size_t>(2 * R)] / static_cast<double>(round_total) : NAN;
    Json record = {{"step", state.step},
                   {"loss", mean_loss},
                   {"lr", last.lr},
                   {"tokens", state.tokens_seen},
                   {"tokens_per_s", static_cast<double>(round_total * tokens_per_replica_step) / round_seconds},
                   {"round_seconds", round_seconds},
                   {"elapsed_s", run.elapsed()},
                   {"replica_steps", per_replica}};
    if (since_sync_total >= setup_.edit().min_total_steps || final_round) {
      record["sync"] = sync_record(edit_->sync(steps_since_sync_));
      steps_since_sync_ = 0;
    } else {
      record["sync"] = "skipped";
    }
    std::optional<RunControl::Shown> shown;
    if (round_total > 0) {
      run.note_train_loss(mean_loss);
      shown = RunControl::Shown{mean_loss, last.lr, last.grad_norm};
      for (int m = 0; m < R; ++m)
        share[static_cast<size_t>(m)] = static_cast<double>(per_replica[static_cast<size_t>(m)]) / static_cast<double>(round_total);
    }
    if (run.conclude(round_first_step, record, shown, time_up)) return;
    round_first_step = state.step;
    quota = quota_of_this_replica();
    round_steps = 0;
    round_loss = 0;
    round_start = Clock::now();
  }
}

}  // namespace lt
