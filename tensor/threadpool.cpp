#include "tensor/threadpool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tensor/cores.h"
#include "tensor/error.h"

namespace lt {
namespace {

thread_local bool in_parallel_region = false;
thread_local int running_slot = 0;  // thread_slot(): set once by each worker

using ChunkJob = FunctionRef<void(int64_t)>;

// A thread's range of items under run_taking_over, on a cache line of its own: each owner claims from its
// own range all the time, and a shared line would move between the cores on every claim.
struct alignas(64) ClaimRange {
  std::atomic<uint64_t> word;
};

// When a pool thread finished its chunk of the current job, on a cache line of its own.
struct alignas(64) FinishTime {
  int64_t ns = 0;
};

int64_t CeilDiv(int64_t x, int64_t y) { return (x + y - 1) / y; }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// How long a waiting thread spins before it sleeps: long enough to bridge the serial code between
// two kernels of a training step, short enough not to matter when the pool is idle.
constexpr auto kSpinTime = std::chrono::microseconds(100);

// Spins until done() or kSpinTime has passed; returns done().
template <class Done>
bool spin_until(Done done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return done();
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

class ThreadPool {
 public:
  explicit ThreadPool(int threads) { start(threads); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // One per thread, for the one run_taking_over a run() serves at a time.
  ClaimRange* claim_ranges() { return claim_ranges_.get(); }
  int64_t wait_ns() const { return wait_ns_.load(std::memory_order_relaxed); }

  void resize(int threads) {
    stop();
    start(threads);
  }

  // Runs job(c) for c in [0, chunks); chunk 0 on the calling thread, chunk c on worker c - 1.
  // Every worker acknowledges every job (those without a chunk too), so when run() returns no worker
  // is still looking at this job's description.
  void run(int64_t chunks, ChunkJob job) {
    job_ = &job;
    chunks_ = chunks;
    error_ = nullptr;
    unfinished_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
    {
      // Under the lock, so a worker about to sleep cannot miss the new generation.
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    run_chunk(job, 0);
    finish_[0].ns = now_ns();
    auto all_done = [&] { return unfinished_.load(std::memory_order_acquire) == 0; };
    if (!spin_until(all_done)) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, all_done);
    }
    // The thread time spent waiting for the last chunk: each thread from its finish to the last one's.
    int64_t last = 0, waited = 0;
    for (int64_t c = 0; c < chunks; ++c) last = std::max(last, finish_[c].ns);
    for (int64_t c = 0; c < chunks; ++c) waited += last - finish_[c].ns;
    wait_ns_.fetch_add(waited, std::memory_order_relaxed);
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Called with no workers running. New workers start at the current generation: a job that ran
  // before they existed is finished, not theirs to pick up.
  void start(int threads) {
    quit_.store(false);
    claim_ranges_ = std::make_unique<ClaimRange[]>(static_cast<size_t>(threads));
    finish_ = std::make_unique<FinishTime[]>(static_cast<size_t>(threads));
    const uint64_t current = generation_.load();
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w, current] { worker_loop(w, current); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_.store(true);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void run_chunk(ChunkJob job, int64_t c) {
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
    running_slot = w;
    auto has_news = [&] { return quit_.load() || generation_.load(std::memory_order_acquire) != seen; };
    for (;;) {
      if (!spin_until(has_news)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, has_news);
      }
      if (quit_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      if (w < chunks_) {
        run_chunk(*job_, w);
        finish_[w].ns = now_ns();  // published to the caller by the release below
      }
      if (unfinished_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);  // pairs with the caller's predicate check
        done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::unique_ptr<ClaimRange[]> claim_ranges_;
  std::unique_ptr<FinishTime[]> finish_;
  std::atomic<int64_t> wait_ns_{0};
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  // Written by run() before the generation is published (release) and read by workers after they
  // see it (acquire).
  const ChunkJob* job_ = nullptr;
  int64_t chunks_ = 0;
  std::atomic<int> unfinished_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> quit_{false};
  std::exception_ptr error_;
};

ThreadPool& pool() {
  static ThreadPool* instance = new ThreadPool(default_threads());  // leaked: lives as long as the process
  return *instance;
}

}  // namespace

int num_threads() { return pool().size(); }

int thread_slot() { return running_slot; }

int64_t pool_wait_ns() { return pool().wait_ns(); }

void run_parallel_work_on_this_thread() { in_parallel_region = true; }

void set_num_threads(int threads) {
  LT_CHECK(!in_parallel_region, "set_num_threads called from inside parallel_for");
  LT_CHECK(threads >= 0, "thread count must be >= 0, got ", threads);
  pool().resize(threads == 0 ? default_threads() : threads);
}

int64_t reduction_chunks(int64_t n, int64_t grain) {
  if (n <= 0) return 0;
  return std::min(CeilDiv(n, std::max<int64_t>(grain, 1)), kMaxReductionChunks);
}

int64_t grain_for_flops(double unit_flops) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(kMinFlopsPerPiece / std::max(unit_flops, 1.0))));
}

int64_t chunk_begin(int64_t n, int64_t chunks, int64_t c) {
  // Even split; the first n % chunks chunks get one extra item.
  const int64_t base = n / chunks, extra = n % chunks;
  return c * base + std::min(c, extra);
}

namespace {

// Runs fn(item) for every item of [0, n) on `threads` threads (at least 2), thread t starting on items
// [first_item(t), first_item(t + 1)). Thread t's range is one 64-bit word, its next item in the high half
// and its end in the low half, so that the owner taking from the front and a thief taking from the back
// claim with one compare-and-swap each and never both take an item. Only the claims are shared: fn's
// writes reach the caller through run()'s own synchronisation.
void run_taking_over(int64_t n, int64_t threads, FunctionRef<int64_t(int64_t)> first_item, ItemFn fn) {
  LT_CHECK(n < (int64_t{1} << 32), "thread pool: ", n, " items, more than a range holds");
  const auto pack = [](int64_t front, int64_t back) {
    return static_cast<uint64_t>(front) << 32 | static_cast<uint64_t>(back);
  };
  ClaimRange* ranges = pool().claim_ranges();
  for (int64_t t = 0; t < threads; ++t)
    ranges[t].word.store(pack(first_item(t), first_item(t + 1)), std::memory_order_relaxed);
  // Claims the front (owner) or back (thief) item of range r; -1 when it is empty.
  const auto claim = [&](int64_t r, bool from_front) -> int64_t {
    uint64_t word = ranges[r].word.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t front = static_cast<int64_t>(word >> 32), back = static_cast<int64_t>(word & 0xffffffffu);
      if (front >= back) return -1;
      const uint64_t claimed = from_front ? pack(front + 1, back) : pack(front, back - 1);
      if (ranges[r].word.compare_exchange_weak(word, claimed, std::memory_order_relaxed))
        return from_front ? front : back - 1;
    }
  };
  pool().run(threads, [&](int64_t t) {
    for (int64_t mine = claim(t, true); mine >= 0; mine = claim(t, true)) fn(mine);
    for (int64_t k = 1; k < threads; ++k)
      for (int64_t theirs = claim((t + k) % threads, false); theirs >= 0; theirs = claim((t + k) % threads, false))
        fn(theirs);
  });
}

}  // namespace

void parallel_for(int64_t n, int64_t grain, ChunkFn fn) {
  if (n <= 0) return;
  // Pieces start at multiples of the grain, so a kernel whose grain is a multiple of its vector width
  // splits its rows or elements where one thread would (a vector loop's scalar tail, whose arithmetic
  // may differ, stays at n).
  grain = std::max<int64_t>(grain, 1);
  const int64_t piece = grain * CeilDiv(CeilDiv(n, grain), kMaxPieces);
  const int64_t pieces = CeilDiv(n, piece);
  const int64_t threads = in_parallel_region ? 1 : std::min<int64_t>(num_threads(), pieces);
  if (threads == 1) {
    fn(0, n);
    return;
  }
  run_taking_over(
      pieces, threads, [&](int64_t t) { return chunk_begin(pieces, threads, t); },
      [&](int64_t p) { fn(p * piece, std::min(n, (p + 1) * piece)); });
}

void parallel_for_slabs(int64_t n, int64_t grain, ChunkFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t slabs = in_parallel_region ? 1 : std::min<int64_t>(num_threads(), CeilDiv(n, grain));
  if (slabs == 1) {
    fn(0, n);
    return;
  }
  pool().run(slabs, [&](int64_t c) { fn(chunk_begin(n, slabs, c), chunk_begin(n, slabs, c + 1)); });
}

void parallel_for_each(int64_t n, ItemCostFn cost, ItemFn fn) {
  if (n <= 0) return;
  const int64_t threads = in_parallel_region ? 1 : std::min<int64_t>(num_threads(), n);
  if (threads == 1) {
    for (int64_t item = 0; item < n; ++item) fn(item);
    return;
  }
  int64_t total = 0;
  for (int64_t item = 0; item < n; ++item) total += cost(item);
  // Range t ends before the first item whose midpoint lies past (t + 1) / threads of the total cost.
  std::vector<int64_t> firsts(static_cast<size_t>(threads) + 1, n);
  int64_t item = 0, before = 0;
  for (int64_t t = 0; t < threads; ++t) {
    firsts[static_cast<size_t>(t)] = item;
    while (item < n && (2 * before + cost(item)) * threads <= 2 * (t + 1) * total) before += cost(item++);
  }
  run_taking_over(
      n, threads, [&](int64_t t) { return firsts[static_cast<size_t>(t)]; }, fn);
}

void parallel_for_chunks(int64_t n, int64_t grain, IndexedChunkFn fn) {
  const int64_t chunks = reduction_chunks(n, grain);
  parallel_for(chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) fn(c, chunk_begin(n, chunks, c), chunk_begin(n, chunks, c + 1));
  });
}

}  // namespace lt
