#include "dist/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace lt {

namespace {

// What the process is doing, as the watched scopes mark it: the start of the current collective and of the
// current step (0: none).
std::atomic<int64_t> collective_since{0}, collective_bytes{0}, step_since{0}, step_number{0};
std::atomic<int64_t> collective_total_ns{0};
std::atomic<bool> recording{false};
std::mutex records_mutex;
std::vector<CollectiveRecord> records;
std::atomic<const char*> collective_operation{""};

}  // namespace

class HangWatchdog::Thread {
 public:
  Thread(double timeout_seconds, int rank)
      : timeout_ns_(static_cast<int64_t>(timeout_seconds * 1e9)), rank_(rank), thread_([this] { watch(); }) {}
  ~Thread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  // Looks ten times per timeout (at most every second), so the line comes at most a tenth late.
  void watch() {
    const auto period = std::chrono::nanoseconds(std::min<int64_t>(timeout_ns_ / 10, 1'000'000'000));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, period, [this] { return quit_; })) {
      const int64_t now = watch_clock_ns();
      const int64_t collective = collective_since.load(std::memory_order_acquire);
      const int64_t step = step_since.load(std::memory_order_acquire);
      // A rank waiting in a collective is judged by that wait alone, the line that names what it waits
      // for; its step, which began before it, would otherwise run out first on a slow machine.
      if (collective != 0) {
        if (now - collective > timeout_ns_)
          end(format_line("%s of %lld bytes waited %.1f s for the other ranks", collective_operation.load(),
                          static_cast<long long>(collective_bytes.load()), (now - collective) * 1e-9));
      } else if (step != 0 && now - step > timeout_ns_) {
        end(format_line("step %lld has run for %.1f s", static_cast<long long>(step_number.load()),
                        (now - step) * 1e-9));
      }
    }
  }

  template <class... Args>
  std::string format_line(const char* format, Args... args) const {
    char text[256];
    std::snprintf(text, sizeof text, format, args...);
    return text;
  }

  // The rank line, then the process ends where it is: the other threads may be inside MPI, which a normal
  // exit would wait on.
  [[noreturn]] void end(const std::string& what) const {
    std::fflush(stdout);
    if (rank_ >= 0) std::fprintf(stderr, "lingtrain: error: rank %d: ", rank_);
    else std::fprintf(stderr, "lingtrain: error: ");
    std::fprintf(stderr, "%s, beyond --collective-timeout %g s; ending the run (the last checkpoint is kept)\n",
                 what.c_str(), timeout_ns_ * 1e-9);
    std::fflush(stderr);
    std::_Exit(3);
  }

  const int64_t timeout_ns_;
  const int rank_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool quit_ = false;
  std::thread thread_;  // last: starts once the rest is set
};

int64_t watch_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

HangWatchdog::HangWatchdog(double timeout_seconds, int rank) {
  if (timeout_seconds > 0) thread_ = std::make_unique<Thread>(timeout_seconds, rank);
}

HangWatchdog::~HangWatchdog() = default;

WatchedCollective::WatchedCollective(const char* operation, int64_t bytes) {
  collective_operation.store(operation, std::memory_order_relaxed);
  collective_bytes.store(bytes, std::memory_order_relaxed);
  collective_since.store(watch_clock_ns(), std::memory_order_release);
}

WatchedCollective::~WatchedCollective() {
  const int64_t end = watch_clock_ns(), start = collective_since.exchange(0, std::memory_order_acq_rel);
  collective_total_ns.fetch_add(end - start, std::memory_order_relaxed);
  if (!recording.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(records_mutex);
  records.push_back({collective_operation.load(), collective_bytes.load(), start, end});
}

void record_collectives(bool on) { recording.store(on, std::memory_order_relaxed); }

std::vector<CollectiveRecord> take_collective_records() {
  std::lock_guard<std::mutex> lock(records_mutex);
  return std::exchange(records, {});
}

double collective_seconds() { return static_cast<double>(collective_total_ns.load(std::memory_order_relaxed)) * 1e-9; }

WatchedStep::WatchedStep(int64_t step) {
  step_number.store(step, std::memory_order_relaxed);
  step_since.store(watch_clock_ns(), std::memory_order_release);
}

WatchedStep::~WatchedStep() { step_since.store(0, std::memory_order_release); }

}  // namespace lt
