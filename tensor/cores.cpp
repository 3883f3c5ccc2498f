#include "tensor/cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

namespace lt {
namespace {

// The first whitespace-separated word of a file, "" if it cannot be read.
std::string read_word(const std::string& path) {
  std::ifstream file(path);
  std::string word;
  file >> word;
  return word;
}

// An integer file of sysfs or a cgroup; `fallback` if unreadable.
long long read_integer(const std::string& path, long long fallback) {
  const std::string word = read_word(path);
  if (word.empty()) return fallback;
  try {
    return std::stoll(word);
  } catch (const std::exception&) {
    return fallback;
  }
}

// This process's cgroups (/proc/self/cgroup): per hierarchy, its controllers as ",a,b," (",," for cgroup
// v2) and its path below the hierarchy's mount, "" for the root (inside a container's cgroup namespace
// the path is "/", and the container's limits sit at the mount's root).
struct Cgroup {
  std::string controllers, path;
};
std::vector<Cgroup> read_cgroups() {
  std::vector<Cgroup> cgroups;
  std::ifstream file("/proc/self/cgroup");
  std::string line;
  while (std::getline(file, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    // Appended in place: `"," + line.substr(...)` inlines a prepend whose memcpy GCC 12 cannot bound
    // (a false -Wrestrict), and the temporaries were not needed anyway.
    Cgroup cgroup{",", line.substr(second + 1)};
    cgroup.controllers.append(line, first + 1, second - first - 1).push_back(',');
    if (cgroup.path == "/") cgroup.path.clear();
    cgroups.push_back(cgroup);
  }
  return cgroups;
}

// The smallest positive value of limit(dir) over the cgroup at `root` + `path` and its ancestors up to
// `root`; 0 for none. A parent's limit binds its children, so the smallest counts.
template <class Limit>
double tightest_limit(const std::string& root, const std::string& path, Limit limit) {
  double tightest = 0;
  for (std::string dir = root + path;; dir = dir.substr(0, dir.find_last_of('/'))) {
    const double value = limit(dir);
    if (value > 0 && (tightest == 0 || value < tightest)) tightest = value;
    if (dir.size() <= root.size()) return tightest;
  }
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The tightest of a limit over every hierarchy of this process: limit_v2(dir) along cgroup v2's
// (mounted at /sys/fs/cgroup), limit_v1(dir) along that of the v1 controller `controller` (mounted at
// /sys/fs/cgroup/<controller>; cpu also at /sys/fs/cgroup/cpu,cpuacct, with its usual partner).
template <class LimitV2, class LimitV1>
double cgroup_limit(const std::string& controller, LimitV2 limit_v2, LimitV1 limit_v1) {
  double tightest = 0;
  for (const Cgroup& cgroup : read_cgroups()) {
    double value = 0;
    if (cgroup.controllers == ",,") {
      value = tightest_limit("/sys/fs/cgroup", cgroup.path, limit_v2);
    } else if (cgroup.controllers.find("," + controller + ",") != std::string::npos) {
      value = tightest_limit("/sys/fs/cgroup/" + controller, cgroup.path, limit_v1);
      if (value == 0 && controller == "cpu")
        value = tightest_limit("/sys/fs/cgroup/cpu,cpuacct", cgroup.path, limit_v1);
    }
    if (value > 0 && (tightest == 0 || value < tightest)) tightest = value;
  }
  return tightest;
}

// The cgroup's CPU quota in CPUs, 0 for none: v2's cpu.max, v1's CFS quota over its period.
double read_cpu_quota() {
  return cgroup_limit(
      "cpu", [](const std::string& dir) { return parse_cpu_max(read_text(dir + "/cpu.max")); },
      [](const std::string& dir) {
        const long long quota = read_integer(dir + "/cpu.cfs_quota_us", -1);
        const long long period = read_integer(dir + "/cpu.cfs_period_us", 0);
        return quota > 0 && period > 0 ? double(quota) / double(period) : 0.0;
      });
}

// How many CPUs the cgroup's cpuset holds (a container's --cpuset-cpus), 0 where it says nothing.
int read_cpuset_cpus() {
  return static_cast<int>(cgroup_limit(
      "cpuset",
      [](const std::string& dir) { return double(count_cpu_list(read_word(dir + "/cpuset.cpus.effective"))); },
      [](const std::string& dir) {
        const int effective = count_cpu_list(read_word(dir + "/cpuset.effective_cpus"));
        return double(effective > 0 ? effective : count_cpu_list(read_word(dir + "/cpuset.cpus")));
      }));
}

}  // namespace

int count_cpu_list(const std::string& text) {
  int count = 0;
  std::istringstream in(text);
  std::string range;
  while (std::getline(in, range, ',')) {
    try {
      const size_t dash = range.find('-');
      const int first = std::stoi(range.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
      if (first < 0 || last < first) return 0;
      count += last - first + 1;
    } catch (const std::exception&) {
      return 0;
    }
  }
  return count;
}

double parse_cpu_max(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  try {
    const long long value = std::stoll(quota);
    return value > 0 ? double(value) / double(period) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

CoreFacts read_core_facts() {
  CoreFacts facts;
  const int cpuset = read_cpuset_cpus();
  facts.available_cpus = cpuset > 0 ? cpuset : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  facts.allowed_cpus = facts.allowed_cores = facts.available_cpus;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    // A core is its package, die and core id; a CPU whose topology cannot be read is a core of its own.
    std::set<std::tuple<long long, long long, long long>> cores;
    int cpus = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &mask)) continue;
      ++cpus;
      const std::string topology = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
      const long long core = read_integer(topology + "core_id", -1);
      if (core < 0) {
        cores.insert({-1, -1, cpu});
        continue;
      }
      cores.insert({read_integer(topology + "physical_package_id", 0), read_integer(topology + "die_id", 0), core});
    }
    if (cpus > 0) {
      facts.allowed_cpus = cpus;
      facts.allowed_cores = static_cast<int>(cores.size());
      facts.available_cpus = std::max(facts.available_cpus, cpus);
    }
  }
  facts.cpu_quota = read_cpu_quota();
  return facts;
}

int default_threads(const CoreFacts& facts, int processes) {
  int threads = std::max(1, facts.allowed_cores);
  if (facts.cpu_quota > 0) threads = std::min(threads, std::max(1, static_cast<int>(std::ceil(facts.cpu_quota))));
  const bool bound_by_launcher = facts.allowed_cpus < facts.available_cpus;
  if (processes > 1 && !bound_by_launcher) threads = std::max(1, threads / processes);
  return threads;
}

int default_threads(int processes) {
  static const CoreFacts facts = read_core_facts();
  return default_threads(facts, processes);
}

std::string describe_core_facts(const CoreFacts& facts) {
  std::ostringstream out;
  out << facts.allowed_cores << (facts.allowed_cores == 1 ? " core" : " cores") << " (" << facts.allowed_cpus << " of "
      << facts.available_cpus << " CPUs in the affinity mask";
  if (facts.cpu_quota > 0) out << ", a CPU quota of " << facts.cpu_quota;
  out << ")";
  return out.str();
}

}  // namespace lt
