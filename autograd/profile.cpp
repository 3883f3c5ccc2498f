#include "autograd/profile.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "tensor/device_counters.h"
#include "tensor/threadpool.h"

namespace lt::profile {

std::atomic<bool> g_enabled{false};

namespace {

struct Table {
  std::mutex mutex;
  // Keyed by the name's text, not its pointer: the same literal may live at several addresses, and a
  // node's name() need not outlive the node.
  std::map<std::pair<std::string, Phase>, OpTime> entries;
  std::vector<Segment> timeline;
};

Table& table() {
  static Table instance;
  return instance;
}

// The innermost open scope of this thread, so a closing scope can charge its time to its parent.
thread_local Scope* innermost = nullptr;

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
  }
  return "?";
}

void enable() { g_enabled.store(true, std::memory_order_relaxed); }
void disable() { g_enabled.store(false, std::memory_order_relaxed); }

void reset() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.entries.clear();
  t.timeline.clear();
}

std::vector<Segment> timeline() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.timeline;
}

std::vector<OpTime> report() {
  std::vector<OpTime> out;
  {
    Table& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    for (const auto& [key, entry] : t.entries) out.push_back(entry);
  }
  std::stable_sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return out;
}

void Scope::open(const char* name, Phase phase) {
  open_ = true;
  name_ = name;
  phase_ = phase;
  parent_ = innermost;
  innermost = this;
  wait_start_ns_ = pool_wait_ns();
  const DeviceCounters device = device_counters();
  launches_start_ = device.launches;
  host_syncs_start_ = device.host_syncs;
  start_ = std::chrono::steady_clock::now();
}

void Scope::close() {
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int64_t waited_ns = pool_wait_ns() - wait_start_ns_;
  const DeviceCounters device = device_counters();
  const uint64_t launches = device.launches - launches_start_, host_syncs = device.host_syncs - host_syncs_start_;
  innermost = parent_;
  if (parent_ != nullptr) {
    parent_->child_seconds_ += total;
    parent_->child_wait_ns_ += waited_ns;
    parent_->child_launches_ += launches;
    parent_->child_host_syncs_ += host_syncs;
  }
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  OpTime& entry = t.entries[{std::string(name_), phase_}];
  if (entry.calls == 0) {
    entry.name = name_;
    entry.phase = phase_;
  }
  entry.seconds += total - child_seconds_;
  entry.wait_seconds += static_cast<double>(waited_ns - child_wait_ns_) * 1e-9;
  entry.launches += launches - child_launches_;
  entry.host_syncs += host_syncs - child_host_syncs_;
  ++entry.calls;
  if (parent_ != nullptr) return;
  const auto ns = [](std::chrono::steady_clock::time_point at) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
  };
  const int64_t start_ns = ns(start_), end_ns = start_ns + static_cast<int64_t>(total * 1e9);
  if (!t.timeline.empty() && t.timeline.back().phase == phase_) t.timeline.back().end_ns = end_ns;
  else t.timeline.push_back({phase_, start_ns, end_ns});
}

}  // namespace lt::profile
