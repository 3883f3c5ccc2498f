// A fixed pool of worker threads with deterministic work splitting.
//
// parallel_for(n, grain, fn) is for kernels whose items are independent, where the split cannot change a
// bit. It cuts [0, n) into pieces of `grain` items (a multiple of it where there would be more than
// kMaxPieces), whose bounds depend only on n and grain; each thread starts on a contiguous run of
// pieces, and a thread that finishes its run takes the last pieces of the others'. So threads that run
// at uneven speeds (a vCPU its host takes time from, a core whose data sits in the other core's cache)
// finish together. fn is called once per piece, so a kernel with costly set-up per call sizes its grain
// to match, or uses
//
// parallel_for_slabs(n, grain, fn): at most num_threads() contiguous slabs, one call each, whose bounds
// depend only on n, grain and the thread count (the GEMM, which packs an operand per call).
//
// parallel_for_chunks(n, grain, fn) is for reductions. Its chunk bounds depend only on n and grain,
// not on the thread count, so a kernel that reduces per chunk and combines the chunk results in chunk
// order gives the same bits with 1 thread or 64: a run resumed on a machine with another core count
// continues the same trajectory.
//
// parallel_for_each(n, cost, fn) runs fn(item) for items of uneven cost (the MoE experts' segments): as
// parallel_for, but each thread starts on a contiguous range of about equal cost.
//
// Which thread runs a piece or an item varies from run to run, so each must write only its own outputs.
// Calls made from inside a chunk run serially in the calling thread.
//
// Waking a sleeping thread costs tens of microseconds on a VM, more than a small kernel takes, so a
// worker spins for a short while after each job before it sleeps, and so does the caller while it
// waits for the workers.
#pragma once
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace lt {

// A non-owning reference to a callable: what parallel_for takes, so that passing a lambda with any
// number of captures never allocates (std::function would, past its small buffer, on every call of
// every kernel). The callable must outlive the call it is passed to, as a lambda argument does.
template <class Signature>
class FunctionRef;
template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>)
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): implicit, like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}
  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

int num_threads();
// The running thread's slot in [0, num_threads()): w on the pool's worker w, 0 on any other thread (the
// caller of parallel_for runs its share itself). A kernel gives each thread its own part of one scratch
// allocation by it: made by the caller from the caching allocator, the same every call, where a
// thread_local buffer would grow whenever a thread first happens to take over a task (a matter of
// timing, so a system allocation in some steady-state step).
int thread_slot();
// The thread time the pool's threads have spent, since the process started, waiting at the ends of
// fork-joins for the thread that finished last (each thread from its own finish to the last one's,
// summed over threads and fork-joins), in nanoseconds: how far the work splitting is from even.
// `lingtrain bench` reports it per step.
int64_t pool_wait_ns();
// Makes the calling thread, one the pool does not own (the background checkpoint writer), run its own
// parallel_for calls serially on itself, as calls from inside a chunk do: the pool serves one caller at a
// time, the training thread. The chunked reductions give the same bits either way.
void run_parallel_work_on_this_thread();
// Sets the pool size (>= 1). 0 means default_threads() (tensor/cores.h): one per core this process may
// use. The pool starts at that size. Not to be called from inside a chunk.
void set_num_threads(int threads);

using ChunkFn = FunctionRef<void(int64_t begin, int64_t end)>;
// A piece of parallel work worth a pool worker does at least this many FLOPs (~50 us of FMAs on one core):
// waking a worker whose core is idle took 50-120 us on the 2-vCPU VM (the vCPU halts; 2 us when the core
// is busy), so smaller work runs faster on the calling thread alone. grain_for_flops(unit_flops): the
// grain, in units of unit_flops each, that makes such pieces.
inline constexpr double kMinFlopsPerPiece = 1e7;
int64_t grain_for_flops(double unit_flops);
// Runs fn over [0, n) in pieces [p * size, (p + 1) * size) (the last may be shorter), size the smallest
// multiple of `grain` that makes at most kMaxPieces pieces, or in one call fn(0, n) on one thread.
inline constexpr int64_t kMaxPieces = 1024;
void parallel_for(int64_t n, int64_t grain, ChunkFn fn);
// Runs fn over [0, n) in at most num_threads() slabs of at least `grain` items, one call per slab.
void parallel_for_slabs(int64_t n, int64_t grain, ChunkFn fn);
// Runs fn over [0, n) in reduction_chunks(n, grain) chunks, telling fn which chunk it runs, for
// per-chunk partial results combined in chunk order.
using IndexedChunkFn = FunctionRef<void(int64_t chunk, int64_t begin, int64_t end)>;
void parallel_for_chunks(int64_t n, int64_t grain, IndexedChunkFn fn);
// Runs fn(item) once for every item in [0, n); cost(item) >= 0 sets the starting ranges.
using ItemFn = FunctionRef<void(int64_t item)>;
using ItemCostFn = FunctionRef<int64_t(int64_t item)>;
void parallel_for_each(int64_t n, ItemCostFn cost, ItemFn fn);
// ceil(n / grain) chunks, but at most kMaxReductionChunks: enough to keep every core of a large machine
// busy, few enough that combining the partials stays a small fraction of the work.
inline constexpr int64_t kMaxReductionChunks = 64;
int64_t reduction_chunks(int64_t n, int64_t grain);
// An even split of [0, n) into `chunks` parts: chunk c covers [chunk_begin(c), chunk_begin(c + 1)).
int64_t chunk_begin(int64_t n, int64_t chunks, int64_t c);

}  // namespace lt
