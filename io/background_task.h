// One job at a time on a thread of its own: a checkpoint written while training goes on. start() waits
// for the job before it (so two never overlap and a job sees the files its predecessor wrote), and
// wait() returns once the job is done, rethrowing on the waiting thread whatever the job threw (a full
// disk is then the run's one clear error line, at the next save or at the end).
//
// The job's parallel_for calls run on its own thread (tensor/threadpool.h): the pool belongs to the
// training thread.
#pragma once
#include <exception>
#include <functional>
#include <thread>

namespace lt {

class BackgroundTask {
 public:
  BackgroundTask() = default;
  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;
  // Waits for a running job; its error, if nobody waited for it, is dropped (the process is already on
  // its way out through another).
  ~BackgroundTask();

  void start(std::function<void()> job);
  void wait();
  bool busy() const { return thread_.joinable(); }

 private:
  std::thread thread_;
  std::exception_ptr error_;
};

}  // namespace lt
