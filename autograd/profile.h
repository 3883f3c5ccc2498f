// A per-op wall-time profiler: off by default, switched on by `lingtrain bench --profile 1` and, for one
// step in N, by a training run's --profile-every N.
//
// Every differentiable op opens an LT_PROFILE_SCOPE("name") at the top of its forward function, and the
// engine times each node->backward under the node's name(). Scopes nest (a composite op calls other
// ops, a Linear calls matmul), so each entry accumulates its *self* time: the time inside the scope
// minus the time of the scopes opened inside it. The entries of a step therefore add up to at most the
// step's wall time, and the remainder is time spent outside every scope.
//
// Disabled, a scope costs one relaxed atomic load and a branch. Enabled, it reads the steady clock
// twice and takes a mutex once per scope: a few hundred nanoseconds, against ops that run for
// microseconds to milliseconds. Timing is per calling thread; the kernels' worker threads run inside
// the caller's scope and are counted as its wall time. Each entry also keeps the thread time the pool's
// threads spent waiting at the ends of the op's own fork-joins (tensor/threadpool.h, pool_wait_ns): where
// a step's work splits unevenly. And, on a GPU, the kernel launches and host waits the op issued in its
// self time (tensor/device_counters.h): where a launch-bound step's launches come from.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace lt::profile {

enum class Phase { Forward, Backward, Optimizer };
const char* phase_name(Phase phase);

struct OpTime {
  std::string name;
  Phase phase = Phase::Forward;
  double seconds = 0;       // self time, summed over calls
  double wait_seconds = 0;  // pool threads' waits at the ends of the fork-joins in its self time
  int64_t calls = 0;
  uint64_t launches = 0, host_syncs = 0;  // device work issued in its self time
};

// The switch is global (all threads); flipping it while a scope is open on some thread is allowed:
// that scope still closes and records itself.
extern std::atomic<bool> g_enabled;
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
void enable();
void disable();
// Drops every accumulated entry and the timeline.
void reset();
// The accumulated entries, most time first (ties by name, then phase, so the order is stable).
std::vector<OpTime> report();
// The timeline since the last reset: the outermost scopes in the order they closed, consecutive ones of
// one phase merged into a segment (a step is a few: forward, backward, optimizer, per micro-batch), with
// their steady-clock times in nanoseconds.
struct Segment {
  Phase phase = Phase::Forward;
  int64_t start_ns = 0, end_ns = 0;
};
std::vector<Segment> timeline();

class Scope {
 public:
  // `name` must outlive the scope (a string literal or a node's name()).
  Scope(const char* name, Phase phase) {
    if (enabled()) open(name, phase);
  }
  ~Scope() {
    if (open_) close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(const char* name, Phase phase);
  void close();

  bool open_ = false;
  const char* name_ = nullptr;
  Phase phase_ = Phase::Forward;
  std::chrono::steady_clock::time_point start_;
  double child_seconds_ = 0;  // time of the scopes nested inside this one
  int64_t wait_start_ns_ = 0, child_wait_ns_ = 0;  // pool_wait_ns() at the start; the nested scopes' waits
  // The device counters' launches and host syncs at the start, and those of the nested scopes.
  uint64_t launches_start_ = 0, host_syncs_start_ = 0, child_launches_ = 0, child_host_syncs_ = 0;
  Scope* parent_ = nullptr;
};

}  // namespace lt::profile

#define LT_PROFILE_CONCAT_INNER(a, b) a##b
#define LT_PROFILE_CONCAT(a, b) LT_PROFILE_CONCAT_INNER(a, b)
// Times the rest of the enclosing block as the forward of op `name`.
#define LT_PROFILE_SCOPE(name) \
  ::lt::profile::Scope LT_PROFILE_CONCAT(lt_profile_scope_, __LINE__)((name), ::lt::profile::Phase::Forward)
// The same for another phase (optimizer steps, gradient clipping).
#define LT_PROFILE_PHASE_SCOPE(name, phase) \
  ::lt::profile::Scope LT_PROFILE_CONCAT(lt_profile_scope_, __LINE__)((name), (phase))
