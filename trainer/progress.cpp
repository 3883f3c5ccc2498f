#include "trainer/progress.h"

#include <algorithm>
#include <vector>

#include "io/format_text.h"

namespace lt {

namespace {

std::string duration(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  return s >= 3600 ? format_text("%ldh%02ldm", s / 3600, (s / 60) % 60) : format_text("%ldm%02lds", s / 60, s % 60);
}

constexpr double kLogSeconds = 10;        // a non-terminal line at most this often
constexpr double kLogRunFraction = 0.01;  // and at most once per this share of the run's steps

}  // namespace

ProgressLine::ProgressLine(std::FILE* out, bool interactive, int columns, int64_t total_steps, int64_t first_step)
    : out_(out), interactive_(interactive), columns_(columns), total_steps_(total_steps), first_step_(first_step) {}

ProgressLine::~ProgressLine() { finish(); }

std::string ProgressLine::format(const ProgressFigures& f, double elapsed, int columns) const {
  const double eta = elapsed / static_cast<double>(std::max<int64_t>(f.step - first_step_, 1)) *
                     static_cast<double>(std::max<int64_t>(total_steps_ - f.step, 0));
  // Fields in display order with their priority (lower goes first when the terminal is narrow).
  struct Field {
    std::string text;
    int priority;
  };
  std::vector<Field> fields = {{"step " + std::to_string(f.step) + "/" + std::to_string(total_steps_), 9},
                               {"loss " + format_text("%.4f", f.loss), 8}};
  if (std::isfinite(heldout_loss_)) fields.push_back({"held-out " + format_text("%.4f", heldout_loss_), 7});
  if (std::isfinite(multiple_choice_acc_)) fields.push_back({"mc acc " + format_text("%.3f", multiple_choice_acc_), 3});
  if (std::isfinite(f.lr)) fields.push_back({"lr " + format_text("%.2e", f.lr), 2});
  if (std::isfinite(f.grad_norm)) fields.push_back({"gnorm " + format_text("%.3f", f.grad_norm), 1});
  if (std::isfinite(f.tokens_per_s)) fields.push_back({format_text("%.0f tok/s", f.tokens_per_s), 6});
  if (std::isfinite(f.worst_imbalance))
    fields.push_back(
        {"load max/mean " + format_text("%.2f", f.worst_imbalance) +
             (f.worst_imbalance_layer >= 0 ? " (layer " + std::to_string(f.worst_imbalance_layer) + ")" : ""),
         4});
  fields.push_back({"ETA " + duration(eta), 5});
  auto join = [&]() {
    std::string line;
    for (const Field& field : fields) line += (line.empty() ? "" : " | ") + field.text;
    return line;
  };
  std::string line = join();
  while (columns > 0 && static_cast<int>(line.size()) > columns && fields.size() > 1) {
    fields.erase(std::min_element(fields.begin(), fields.end(),
                                  [](const Field& a, const Field& b) { return a.priority < b.priority; }));
    line = join();
  }
  if (columns > 0 && static_cast<int>(line.size()) > columns) line.resize(static_cast<size_t>(columns));
  return line;
}

void ProgressLine::update(const ProgressFigures& figures, double elapsed) {
  if (interactive_) {
    // At most ~10 redraws a second: a terminal flooded with fast steps lags behind the run.
    if (line_in_place_ && elapsed - last_printed_elapsed_ < 0.1 && figures.step < total_steps_) return;
    last_printed_elapsed_ = elapsed;
    // One column to spare: a line exactly as wide as the terminal wraps, and \r then redraws only its tail.
    const std::string line = format(figures, elapsed, columns_ > 0 ? columns_ - 1 : 0);
    // \r and erase-to-end-of-line: a shorter line leaves nothing of the longer one before it.
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
    std::fflush(out_);
    line_in_place_ = true;
    last_line_ = line;
    return;
  }
  const bool first = last_printed_step_ < 0, last = figures.step >= total_steps_;
  const double run_steps = static_cast<double>(std::max<int64_t>(total_steps_ - first_step_, 1));
  const bool due = elapsed - last_printed_elapsed_ >= kLogSeconds &&
                   static_cast<double>(figures.step - last_printed_step_) >= kLogRunFraction * run_steps;
  if (!first && !last && !due) return;
  std::fprintf(out_, "%s\n", format(figures, elapsed, 0).c_str());
  std::fflush(out_);
  last_printed_step_ = figures.step;
  last_printed_elapsed_ = elapsed;
}

void ProgressLine::event(const std::string& line) {
  if (line_in_place_) std::fprintf(out_, "\r\x1b[K");
  std::fprintf(out_, "%s\n", line.c_str());
  if (line_in_place_) std::fprintf(out_, "%s", last_line_.c_str());
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (!line_in_place_) return;
  std::fprintf(out_, "\n");
  std::fflush(out_);
  line_in_place_ = false;
}

}  // namespace lt
