// The thread pool: exact coverage of [0, n), piece bounds that depend only on (n, grain) for
// parallel_for and the reduction chunks and slab bounds on (n, grain, threads) for parallel_for_slabs,
// parallel_for_each's items each run once, pieces and items taken over from a thread that is held up,
// exceptions carried back to the caller, and nested calls that run serially.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tensor/cores.h"
#include "tensor/error.h"
#include "tensor/threadpool.h"

namespace lt {
namespace {

// Restores the pool size a test found, whatever the test does with it.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : original_(num_threads()) {}
  ~ThreadCountGuard() { set_num_threads(original_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int original_;
};

using Range = std::pair<int64_t, int64_t>;

// The (chunk, begin, end) triples one parallel_for_chunks call ran, in chunk order. Each chunk writes
// only its own slot, so recording needs no lock.
std::vector<Range> run_chunks(int64_t n, int64_t grain) {
  std::vector<Range> ranges(static_cast<size_t>(reduction_chunks(n, grain)), Range{-1, -1});
  parallel_for_chunks(n, grain, [&](int64_t chunk, int64_t begin, int64_t end) {
    ranges.at(static_cast<size_t>(chunk)) = {begin, end};
  });
  return ranges;
}

// The (begin, end) ranges of one call of parallel_for (slabs false) or parallel_for_slabs, sorted, after
// checking that they cover [0, n) exactly once: each index counts its visits, so overlapping ranges would
// show as a count of 2 and a gap as 0.
std::vector<Range> run_ranges(int64_t n, int64_t grain, bool slabs) {
  std::vector<int> visits(static_cast<size_t>(n), 0);
  std::mutex ranges_mutex;
  std::vector<Range> ranges;
  const auto record = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ++visits[static_cast<size_t>(i)];
    std::lock_guard<std::mutex> lock(ranges_mutex);
    ranges.push_back({begin, end});
  };
  if (slabs)
    parallel_for_slabs(n, grain, record);
  else
    parallel_for(n, grain, record);
  EXPECT_EQ(visits, std::vector<int>(static_cast<size_t>(n), 1));
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

// The even split of [0, n) into `parts` ranges.
std::vector<Range> even_split(int64_t n, int64_t parts) {
  std::vector<Range> ranges;
  for (int64_t c = 0; c < parts; ++c) ranges.push_back({chunk_begin(n, parts, c), chunk_begin(n, parts, c + 1)});
  return ranges;
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadCountGuard guard;
  for (int threads = 1; threads <= 4; ++threads) {
    set_num_threads(threads);
    ASSERT_EQ(num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 4, 5, 7, 64, 100, 1000, 12345})
      for (int64_t grain : {0, 1, 2, 3, 7, 64, 1000, 100000}) {
        SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                     " grain=" + std::to_string(grain));
        const int64_t by_grain = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);
        // parallel_for: one call on one thread, else pieces at multiples of the grain that depend on n
        // and grain alone (at most kMaxPieces of them: 12345 items of grain 1 come in pieces of 13).
        const int64_t piece = std::max<int64_t>(grain, 1) * ((by_grain + kMaxPieces - 1) / kMaxPieces);
        std::vector<Range> expected_pieces;
        for (int64_t begin = 0; begin < n; begin += piece)
          expected_pieces.push_back({begin, std::min(n, begin + piece)});
        if (threads == 1 || expected_pieces.size() <= 1) expected_pieces = even_split(n, std::min<int64_t>(n, 1));
        EXPECT_EQ(run_ranges(n, grain, false), expected_pieces);
        // parallel_for_slabs: one slab per thread, as many as the grain allows.
        EXPECT_EQ(run_ranges(n, grain, true), even_split(n, std::min<int64_t>(threads, by_grain)));
      }
  }
}

TEST(ThreadPool, ReductionChunksDependOnlyOnSizeAndGrain) {
  ThreadCountGuard guard;
  for (int64_t n : {1, 5, 17, 64, 65, 1000, 4099, 1000000})
    for (int64_t grain : {1, 4, 100}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " grain=" + std::to_string(grain));
      const int64_t chunks = reduction_chunks(n, grain);
      EXPECT_EQ(chunks, std::min<int64_t>((n + grain - 1) / grain, kMaxReductionChunks));
      set_num_threads(1);
      const std::vector<Range> first = run_chunks(n, grain);
      ASSERT_EQ(static_cast<int64_t>(first.size()), chunks);
      // Contiguous, in chunk order, as chunk_begin says, even split (sizes differ by at most one).
      int64_t smallest = n, largest = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        EXPECT_EQ(first[c].first, chunk_begin(n, chunks, c));
        EXPECT_EQ(first[c].second, chunk_begin(n, chunks, c + 1));
        smallest = std::min(smallest, first[c].second - first[c].first);
        largest = std::max(largest, first[c].second - first[c].first);
      }
      EXPECT_EQ(chunk_begin(n, chunks, 0), 0);
      EXPECT_EQ(chunk_begin(n, chunks, chunks), n);
      EXPECT_LE(largest - smallest, 1);
      // Any thread count, run after run, and from inside another parallel_for: the same bounds.
      for (int threads : {2, 3, 4, 7}) {
        set_num_threads(threads);
        for (int repeat = 0; repeat < 3; ++repeat) EXPECT_EQ(run_chunks(n, grain), first) << threads << " threads";
      }
      std::vector<Range> nested;
      parallel_for(4, 1, [&](int64_t begin, int64_t) {
        if (begin == 0) nested = run_chunks(n, grain);
      });
      EXPECT_EQ(nested, first);
    }
  EXPECT_EQ(reduction_chunks(0, 1), 0);
}

TEST(ThreadPool, ForEachRunsEveryItemOnce) {
  ThreadCountGuard guard;
  for (int threads = 1; threads <= 4; ++threads) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 16, 100, 1001}) {
      // Uniform costs, costs that put everything on one item, and costs that are mostly zero.
      for (int shape = 0; shape < 3; ++shape) {
        SCOPED_TRACE("threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                     " shape=" + std::to_string(shape));
        std::vector<std::atomic<int>> visits(static_cast<size_t>(n));
        parallel_for_each(
            n,
            [&](int64_t item) -> int64_t {
              if (shape == 0) return 3;
              if (shape == 1) return item == n / 2 ? 1000 : 1;
              return item % 7 == 0 ? item : 0;
            },
            [&](int64_t item) { ++visits[static_cast<size_t>(item)]; });
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(visits[static_cast<size_t>(i)].load(), 1) << "item " << i;
      }
    }
  }
}

TEST(ThreadPool, AHeldUpThreadsPiecesAndItemsGoToTheOthers) {
  // 2 threads, 8 pieces (parallel_for, grain 1) or items of equal cost (parallel_for_each): the caller
  // starts on 0-3, the worker on 4-7. Whoever runs 0 waits there until 3, the last of the caller's range,
  // has run: when the caller is held in 0, only the worker can run 3, by taking it over. The wait is
  // bounded, so a pool that never takes work over fails instead of hanging. A worker that starts first
  // may finish everything, 0 included, before the caller claims anything, and then nobody is held: such
  // a trial is run again.
  ThreadCountGuard guard;
  set_num_threads(2);
  for (bool for_each : {false, true}) {
    SCOPED_TRACE(for_each ? "parallel_for_each" : "parallel_for");
    int held_trials = 0;
    for (int trial = 0; trial < 20 && held_trials == 0; ++trial) {
      std::vector<std::atomic<bool>> done(8);
      std::vector<std::thread::id> ran_on(8);
      std::atomic<bool> held{false}, waited_in_vain{false};
      const auto run = [&](int64_t item) {
        if (item == 0 && !done[3].load()) {
          held = true;
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (!done[3].load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
          waited_in_vain = !done[3].load();
        }
        ran_on[static_cast<size_t>(item)] = std::this_thread::get_id();
        done[static_cast<size_t>(item)] = true;
      };
      if (for_each) {
        parallel_for_each(8, [](int64_t) -> int64_t { return 1; }, run);
      } else {
        parallel_for(8, 1, [&](int64_t begin, int64_t end) {
          EXPECT_EQ(end, begin + 1);
          run(begin);
        });
      }
      for (int i = 0; i < 8; ++i) EXPECT_TRUE(done[static_cast<size_t>(i)].load()) << i;
      if (!held.load()) continue;
      ++held_trials;
      EXPECT_FALSE(waited_in_vain.load()) << "3 was never taken over from the held-up thread";
      EXPECT_NE(ran_on[3], ran_on[0]);
      EXPECT_EQ(ran_on[7], ran_on[3]) << "the worker's own range first";
    }
    EXPECT_EQ(held_trials, 1) << "no trial held a thread up";
  }
}

TEST(ThreadPool, WaitsAtTheEndOfAForkJoinAreCounted) {
  // Two slabs, the worker's 20 ms longer: the caller waits at least that long for it. On one thread
  // nothing is split and nothing waits.
  ThreadCountGuard guard;
  set_num_threads(2);
  int64_t before = pool_wait_ns();
  parallel_for_slabs(2, 1, [](int64_t begin, int64_t) {
    if (begin == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
  const int64_t waited = pool_wait_ns() - before;
  EXPECT_GE(waited, 20'000'000);
  EXPECT_LT(waited, 10'000'000'000) << "the wait is the gap between the finishes, not time since the start";
  set_num_threads(1);
  before = pool_wait_ns();
  parallel_for(2, 1, [](int64_t, int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); });
  EXPECT_EQ(pool_wait_ns(), before);
}

TEST(ThreadPool, ForEachCarriesExceptionsAndRunsSeriallyWhenNested) {
  ThreadCountGuard guard;
  set_num_threads(3);
  const auto unit = [](int64_t) -> int64_t { return 1; };
  EXPECT_THROW(parallel_for_each(50, unit,
                                 [](int64_t item) {
                                   if (item == 49) fail("item ", item, " failed");
                                 }),
               Error);
  std::vector<std::thread::id> inner(20);
  parallel_for(3, 1, [&](int64_t begin, int64_t) {
    if (begin == 1)
      parallel_for_each(20, unit, [&](int64_t item) { inner[static_cast<size_t>(item)] = std::this_thread::get_id(); });
  });
  for (const std::thread::id& id : inner) EXPECT_EQ(id, inner[0]) << "a nested call runs on the calling thread";
}

TEST(ThreadPool, ResizingBetweenRunsKeepsWorking) {
  // New workers must not mistake a job that finished before they were started for a new one.
  ThreadCountGuard guard;
  for (int round = 0; round < 20; ++round) {
    for (int threads : {2, 2, 4, 3, 1, 4}) {
      set_num_threads(threads);
      std::vector<int> visits(100, 0);
      parallel_for(100, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ++visits[static_cast<size_t>(i)];
      });
      ASSERT_EQ(visits, std::vector<int>(100, 1)) << "threads=" << threads;
    }
  }
}

TEST(ThreadPool, ExceptionsInAChunkReachTheCaller) {
  ThreadCountGuard guard;
  for (int threads = 1; threads <= 4; ++threads) {
    set_num_threads(threads);
    for (int64_t failing_index : {int64_t{0}, int64_t{999}}) {  // in the caller's chunk, in the last chunk
      SCOPED_TRACE("threads=" + std::to_string(threads) + " failing index " + std::to_string(failing_index));
      try {
        parallel_for(1000, 1, [&](int64_t begin, int64_t end) {
          if (begin <= failing_index && failing_index < end) fail("chunk [", begin, ", ", end, ") failed");
        });
        ADD_FAILURE() << "expected an lt::Error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("failed"), std::string::npos) << e.what();
      }
    }
    // Every chunk throwing: one error comes back, and the pool still works afterwards.
    EXPECT_THROW(parallel_for(1000, 1, [](int64_t, int64_t) { fail("every chunk fails"); }), Error);
    std::vector<int> visits(1000, 0);
    parallel_for(1000, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ++visits[static_cast<size_t>(i)];
    });
    EXPECT_EQ(visits, std::vector<int>(1000, 1));
  }
}

TEST(ThreadPool, NestedCallsRunSeriallyWithoutDeadlock) {
  ThreadCountGuard guard;
  for (int threads = 1; threads <= 4; ++threads) {
    set_num_threads(threads);
    const int64_t outer = 64, inner = 1000;
    std::vector<int> visits(static_cast<size_t>(outer * inner), 0);
    std::vector<int64_t> inner_chunks(static_cast<size_t>(outer), 0);
    parallel_for(outer, 1, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o) {
        parallel_for(inner, 1, [&](int64_t b, int64_t e) {
          ++inner_chunks[static_cast<size_t>(o)];
          EXPECT_EQ(b, 0);
          EXPECT_EQ(e, inner);
          for (int64_t i = b; i < e; ++i) ++visits[static_cast<size_t>(o * inner + i)];
        });
      }
    });
    EXPECT_EQ(visits, std::vector<int>(static_cast<size_t>(outer * inner), 1));
    EXPECT_EQ(inner_chunks, std::vector<int64_t>(static_cast<size_t>(outer), 1));
    // Outside any chunk again, work is split as before.
    std::atomic<int> slabs{0};
    parallel_for_slabs(inner, 1, [&](int64_t, int64_t) { ++slabs; });
    EXPECT_EQ(slabs.load(), threads);
  }
}

TEST(ThreadPool, ResizingFromInsideAChunkIsAnError) {
  ThreadCountGuard guard;
  set_num_threads(2);
  EXPECT_THROW(parallel_for(10, 1, [](int64_t, int64_t) { set_num_threads(1); }), Error);
  EXPECT_THROW(set_num_threads(-1), Error);
  set_num_threads(0);  // one per core this process may use
  EXPECT_EQ(num_threads(), default_threads());
}

}  // namespace
}  // namespace lt
