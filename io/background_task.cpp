#include "io/background_task.h"

#include <utility>

#include "tensor/threadpool.h"

namespace lt {

BackgroundTask::~BackgroundTask() {
  if (thread_.joinable()) thread_.join();
}

void BackgroundTask::start(std::function<void()> job) {
  wait();
  thread_ = std::thread([this, job = std::move(job)] {
    run_parallel_work_on_this_thread();
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void BackgroundTask::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace lt
