#include "tensor/threadpool.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tensor/error.h"

namespace lt {
namespace {

thread_local bool in_parallel_region = false;

class ThreadPool {
 public:
  explicit ThreadPool(int threads) { start(threads); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int threads) {
    stop();
    start(threads);
  }

  // Runs job(c) for c in [0, chunks); chunk 0 on the calling thread, chunk c on worker c - 1.
  void run(int64_t chunks, const std::function<void(int64_t)>& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      chunks_ = chunks;
      pending_ = static_cast<int>(chunks - 1);
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    run_chunk(job, 0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Called with no workers running. New workers start at the current generation: a job that ran
  // before they existed is finished, not theirs to pick up (its pointer is already gone).
  void start(int threads) {
    quit_ = false;
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w, seen = generation_] { worker_loop(w, seen); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void run_chunk(const std::function<void(int64_t)>& job, int64_t c) {
    in_parallel_region = true;
    try {
      job(c);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    in_parallel_region = false;
  }

  void worker_loop(int w, uint64_t seen) {
    for (;;) {
      const std::function<void(int64_t)>* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
        if (w >= chunks_) continue;  // fewer chunks than workers this time
        job = job_;
      }
      run_chunk(*job, w);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t chunks_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
  std::exception_ptr error_;
};

int hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

ThreadPool& pool() {
  static ThreadPool* instance = new ThreadPool(hardware_threads());  // leaked: lives as long as the process
  return *instance;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int threads) {
  LT_CHECK(!in_parallel_region, "set_num_threads called from inside parallel_for");
  LT_CHECK(threads >= 0, "thread count must be >= 0, got ", threads);
  pool().resize(threads == 0 ? hardware_threads() : threads);
}

int64_t num_chunks(int64_t n, int64_t grain) {
  if (n <= 0) return 0;
  grain = std::max<int64_t>(grain, 1);
  const int64_t by_grain = (n + grain - 1) / grain;
  return in_parallel_region ? 1 : std::min<int64_t>(num_threads(), by_grain);
}

int64_t chunk_begin(int64_t n, int64_t chunks, int64_t c) {
  // Even split; the first n % chunks chunks get one extra item.
  const int64_t base = n / chunks, extra = n % chunks;
  return c * base + std::min(c, extra);
}

void parallel_for_chunks(int64_t n, int64_t grain, const IndexedChunkFn& fn) {
  const int64_t chunks = num_chunks(n, grain);
  if (chunks == 0) return;
  if (chunks == 1) {
    fn(0, 0, n);
    return;
  }
  pool().run(chunks, [&](int64_t c) { fn(c, chunk_begin(n, chunks, c), chunk_begin(n, chunks, c + 1)); });
}

void parallel_for(int64_t n, int64_t grain, const ChunkFn& fn) {
  parallel_for_chunks(n, grain, [&](int64_t, int64_t begin, int64_t end) { fn(begin, end); });
}

}  // namespace lt
