// The live progress line of a training run (rank 0's). On a terminal it rewrites itself in place:
// step, loss, held-out loss and multiple-choice accuracy once known, tokens/s, ETA and the worst
// expert-load imbalance. Into a file or a pipe it prints one such line when at least 10 s of training and
// 1% of the run's steps have passed since the last one (and at the first and last step), so a log holds
// ~100 lines however long the run, never more than one per 10 s; metrics.jsonl keeps every step. Events
// (held-out figures, spikes, stage changes) always get a line of their own.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace lt {

struct ProgressFigures {
  int64_t step = 0;
  double loss = NAN, lr = NAN, grad_norm = NAN, tokens_per_s = NAN;
  double worst_imbalance = NAN;  // the largest max/mean expert load over the MoE layers (NaN: dense)
  int64_t worst_imbalance_layer = -1;
};

class ProgressLine {
 public:
  // interactive: `out` is a terminal of `columns` columns (0: unknown), rewritten in place.
  ProgressLine(std::FILE* out, bool interactive, int columns, int64_t total_steps, int64_t first_step);
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // A step done, `elapsed` seconds into the run.
  void update(const ProgressFigures& figures, double elapsed);
  void set_heldout_loss(double loss) { heldout_loss_ = loss; }
  void set_multiple_choice_accuracy(double acc) { multiple_choice_acc_ = acc; }
  // A line of its own (no newline needed); on a terminal, the progress line is redrawn below it.
  void event(const std::string& line);
  // Leaves the in-place line (before other output, and at the end of training).
  void finish();

  // The text of a progress line (for the tests): at most `columns` characters when columns > 0,
  // dropping the learning rate and gradient norm first.
  std::string format(const ProgressFigures& figures, double elapsed, int columns) const;

 private:
  std::FILE* out_;
  bool interactive_;
  int columns_;
  int64_t total_steps_, first_step_;
  double heldout_loss_ = NAN;
  double multiple_choice_acc_ = NAN;
  bool line_in_place_ = false;  // a terminal line without its newline yet
  std::string last_line_;
  int64_t last_printed_step_ = -1;
  double last_printed_elapsed_ = 0;
};

}  // namespace lt
