#include "trainer/metrics_sink.h"

#include <cmath>
#include <filesystem>

#include "io/console.h"
#include "io/format_text.h"

namespace lt {

namespace {

// What the progress line shows of a step's record: the worst expert-load imbalance among the layers.
ProgressFigures progress_figures(const Json& record, double loss, double lr, double grad_norm) {
  ProgressFigures f;
  f.step = record.value("step", int64_t{0});
  f.loss = loss;
  f.lr = lr;
  f.grad_norm = grad_norm;
  f.tokens_per_s = record.value("tokens_per_s", std::nan(""));
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

// A fresh run starts its log anew (a folder may hold an earlier run's); a resumed one continues it.
const std::string& fresh_or_kept(const std::string& path, int64_t resumed_step) {
  if (!path.empty() && resumed_step < 0) std::filesystem::remove(path);
  return path;
}

}  // namespace

MetricsSink::MetricsSink(std::FILE* out, bool lead, const std::string& path, int64_t resumed_step,
                         int64_t total_steps, int64_t first_step)
    : log_(fresh_or_kept(path, resumed_step), resumed_step),
      progress_(out, lead && is_terminal(out), lead ? terminal_columns(out) : 0, total_steps, first_step) {}

void MetricsSink::show(const Json& record, double loss, double lr, double grad_norm, double elapsed) {
  if (record.contains("val_loss")) {
    const int64_t step = record.value("step", int64_t{0});
    progress_.set_heldout_loss(record["val_loss"].get<double>());
    std::string line = format_text("step %lld: held-out loss %.4f", static_cast<long long>(step),
                                   record["val_loss"].get<double>());
    if (record.contains("val_conversations"))
      line += " (" + count_of(record["val_conversations"].get<int64_t>(), "conversation") + ")";
    if (record.contains("eval_rewards/accuracies"))
      line += format_text(", rewards/accuracies %.3f, rewards/margins %.3f",
                          record["eval_rewards/accuracies"].get<double>(), record["eval_rewards/margins"].get<double>());
    progress_.event(line);
  }
  if (record.contains("mc_acc")) {
    progress_.set_multiple_choice_accuracy(record["mc_acc"].get<double>());
    progress_.event(format_text("step %lld: multiple-choice acc %.4f, acc_norm %.4f (%s, chance %.4f)",
                                static_cast<long long>(record.value("step", int64_t{0})),
                                record["mc_acc"].get<double>(),
                                record["mc_acc_norm"].get<double>(),
                                count_of(record["mc_items"].get<int64_t>(), "item").c_str(),
                                record["mc_chance"].get<double>()));
  }
  progress_.update(progress_figures(record, loss, lr, grad_norm), elapsed);
}

}  // namespace lt
