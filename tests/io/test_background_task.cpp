#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "io/background_task.h"
#include "tensor/threadpool.h"

namespace lt {
namespace {

TEST(BackgroundTask, StartWaitsForThePreviousJob) {
  BackgroundTask task;
  std::atomic<int> finished{0};
  task.start([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    finished = 1;
  });
  EXPECT_TRUE(task.busy());
  task.start([&] { finished = finished * 10 + 2; });  // the first must be done when the second runs
  task.wait();
  EXPECT_EQ(finished.load(), 12);
  EXPECT_FALSE(task.busy());
}

TEST(BackgroundTask, AJobsErrorIsThrownByTheNextWait) {
  BackgroundTask task;
  task.start([] { throw std::runtime_error("disk full"); });
  EXPECT_THROW(task.wait(), std::runtime_error);
  EXPECT_NO_THROW(task.wait());  // reported once
  task.start([] { throw std::runtime_error("again"); });
  EXPECT_THROW(task.start([] {}), std::runtime_error);  // start waits, and so reports it
}

// The job's parallel_for runs on its own thread, so the training thread keeps the pool.
TEST(BackgroundTask, AJobsParallelWorkStaysOnItsThread) {
  BackgroundTask task;
  std::thread::id job_thread, piece_thread;
  int pieces = 0;
  task.start([&] {
    job_thread = std::this_thread::get_id();
    parallel_for(1 << 20, 1, [&](int64_t, int64_t) {
      piece_thread = std::this_thread::get_id();
      ++pieces;
    });
  });
  task.wait();
  EXPECT_EQ(pieces, 1);
  EXPECT_EQ(piece_thread, job_thread);
}

}  // namespace
}  // namespace lt
