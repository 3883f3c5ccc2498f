// The live progress line (trainer/progress.h): in place on a terminal, throttled into a log.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "trainer/progress.h"

namespace lt {
namespace {

// Captures what a ProgressLine writes.
class Capture {
 public:
  Capture() : file_(open_memstream(&buffer_, &size_)) {}
  ~Capture() {
    std::fclose(file_);
    std::free(buffer_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(buffer_, size_);
  }

 private:
  char* buffer_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

size_t lines(const std::string& text) {
  size_t n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

ProgressFigures figures(int64_t step) {
  ProgressFigures f;
  f.step = step;
  f.loss = 2.5;
  f.lr = 1e-3;
  f.grad_norm = 0.5;
  f.tokens_per_s = 20000;
  f.worst_imbalance = 1.4;
  f.worst_imbalance_layer = 2;
  return f;
}

TEST(ProgressLine, ALogGetsALineEvery10SecondsAndOnePercent) {
  // make train: 1500 steps of 0.08 s. One line per 10 s: 12, plus the first and the last.
  Capture capture;
  {
    ProgressLine progress(capture.file(), false, 0, 1500, 0);
    for (int64_t step = 1; step <= 1500; ++step) progress.update(figures(step), 0.08 * static_cast<double>(step));
  }
  const std::string text = capture.text();
  EXPECT_GE(lines(text), 12u);
  EXPECT_LE(lines(text), 14u);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.rfind("step 1/1500 |", 0), 0u);
  EXPECT_NE(text.find("step 1500/1500 |"), std::string::npos);
  EXPECT_NE(text.find("load max/mean 1.40 (layer 2)"), std::string::npos);
}

TEST(ProgressLine, ALongRunLogsAbout100Lines) {
  // 200,000 fast steps over 10 hours: 1% of the run (2000 steps) apart, not every 10 s.
  Capture capture;
  {
    ProgressLine progress(capture.file(), false, 0, 200000, 0);
    for (int64_t step = 1; step <= 200000; ++step) progress.update(figures(step), 0.18 * static_cast<double>(step));
  }
  EXPECT_GE(lines(capture.text()), 100u);
  EXPECT_LE(lines(capture.text()), 102u);
}

TEST(ProgressLine, ATerminalLineIsRewrittenInPlace) {
  Capture capture;
  ProgressLine progress(capture.file(), true, 0, 10, 0);
  progress.update(figures(1), 0.0);
  progress.update(figures(2), 1.0);
  progress.set_heldout_loss(2.75);
  progress.event("step 2: held-out loss 2.7500");
  progress.update(figures(3), 2.0);
  progress.finish();
  const std::string text = capture.text();
  // Each draw returns to the line's start and erases what a longer line left.
  EXPECT_EQ(text.rfind("\rstep 1/10 | loss 2.5000", 0), 0u);
  EXPECT_NE(text.find("\x1b[K\rstep 2/10"), std::string::npos);
  // The event gets its own line, and the progress line comes back below it with the held-out loss.
  EXPECT_NE(text.find("\r\x1b[Kstep 2: held-out loss 2.7500\nstep 2/10"), std::string::npos);
  EXPECT_NE(text.find("step 3/10 | loss 2.5000 | held-out 2.7500 |"), std::string::npos);
  EXPECT_EQ(lines(text), 2u);  // the event's and finish()'s
}

TEST(ProgressLine, ANarrowTerminalKeepsTheImportantFields) {
  Capture capture;
  ProgressLine progress(capture.file(), true, 0, 1000, 0);
  progress.set_heldout_loss(2.75);
  const std::string wide = progress.format(figures(10), 5.0, 0);
  EXPECT_NE(wide.find("gnorm"), std::string::npos);
  const std::string narrow = progress.format(figures(10), 5.0, 80);
  EXPECT_LE(narrow.size(), 80u);
  EXPECT_EQ(narrow.find("gnorm"), std::string::npos);  // dropped first
  EXPECT_NE(narrow.find("held-out 2.7500"), std::string::npos);
  EXPECT_NE(narrow.find("ETA"), std::string::npos);
  EXPECT_LE(progress.format(figures(10), 5.0, 12).size(), 12u);
}

}  // namespace
}  // namespace lt
