#include "trainer/lockstep_strategy.h"

#include <algorithm>

namespace lt {

namespace {

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
    const auto first = values.begin() + static_cast<int64_t>(i);
    layer.max_logit = *std::max_element(first, first + ranks);
    i += static_cast<size_t>(ranks);
  }
  for (double& sum : stats.objective_stats) sum = values[i++];
  return any_stop;
}

}  // namespace

double LockstepStrategy::mean_over(Communicator& ranks, double value) {
  if (ranks.size() == 1) return value;
  Tensor t = Tensor::full({1}, value, DType::F64);
  ranks.all_reduce(t, ReduceOp::Mean);
  return t.item();
}

bool LockstepStrategy::run_lockstep(RunControl& run, int64_t end) {
  TrainState& state = run.state();
  while (state.stage_step < end) {
    before_step(run);
    StepStats stats = run.train_step();
    const Json synced = after_step(run, stats);
    // The ranks agree on the stop (rank 0's clock decides) in the same exchange as the statistics.
    const bool time_up = share_step_statistics(data_parallel_, stats, run.time_up());
    run.note_train_loss(stats.lm_loss);
    Json record = run.step_record(stats);
    if (!synced.is_null()) record["sync"] = synced;
    if (stats.decision == UpdateDecision::Retry) {  // the step is taken again on the next batch
      run.sink().write(record);
      continue;
    }
    if (run.conclude(state.step - 1, record, RunControl::Shown{stats.lm_loss, stats.lr, stats.grad_norm}, time_up))
      return true;
  }
  return false;
}

}  // namespace lt
