#include "tensor/cores.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

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

// The tightest CPU limit of the cgroup at `dir` and its ancestors up to `root`, in CPUs; 0 for none.
// limit(dir) reads one level. A parent's limit binds its children, so the smallest counts.
template <class Limit>
double tightest_limit(const std::string& root, std::string dir, Limit limit) {
  double tightest = 0;
  for (;;) {
    const double cpus = limit(dir);
    if (cpus > 0 && (tightest == 0 || cpus < tightest)) tightest = cpus;
    if (dir.size() <= root.size()) return tightest;
    dir = dir.substr(0, dir.find_last_of('/'));
  }
}

// The cgroup's CPU quota in CPUs (0 for none): cgroup v2's cpu.max, else v1's CFS quota, along the path
// /proc/self/cgroup gives (inside a container's cgroup namespace that is "/", and the limit sits at the
// mount's root).
double read_cpu_quota() {
  std::ifstream cgroups("/proc/self/cgroup");
  std::string line;
  double quota = 0;
  while (std::getline(cgroups, line)) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    std::string path = line.substr(second + 1);
    if (path == "/") path.clear();
    double cpus = 0;
    if (controllers == ",,") {
      const std::string root = "/sys/fs/cgroup";
      cpus = tightest_limit(root, root + path, [](const std::string& dir) {
        std::ifstream file(dir + "/cpu.max");
        std::stringstream text;
        text << file.rdbuf();
        return parse_cpu_max(text.str());
      });
    } else if (controllers.find(",cpu,") != std::string::npos) {
      for (const std::string root : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"})
        if (const double found = tightest_limit(root, root + path,
                                                [](const std::string& dir) {
                                                  const long long quota = read_integer(dir + "/cpu.cfs_quota_us", -1);
                                                  const long long period = read_integer(dir + "/cpu.cfs_period_us", 0);
                                                  return quota > 0 && period > 0 ? double(quota) / double(period) : 0.0;
                                                });
            found > 0) {
          cpus = found;
          break;
        }
    }
    if (cpus > 0 && (quota == 0 || cpus < quota)) quota = cpus;
  }
  return quota;
}

}  // namespace

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
  facts.online_cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  facts.allowed_cpus = facts.allowed_cores = facts.online_cpus;
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
      facts.online_cpus = std::max(facts.online_cpus, cpus);
    }
  }
  facts.cpu_quota = read_cpu_quota();
  return facts;
}

int default_threads(const CoreFacts& facts, int processes) {
  int threads = std::max(1, facts.allowed_cores);
  if (facts.cpu_quota > 0) threads = std::min(threads, std::max(1, static_cast<int>(std::ceil(facts.cpu_quota))));
  const bool bound_by_launcher = facts.allowed_cpus < facts.online_cpus;
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
      << facts.online_cpus << " online CPUs in the affinity mask";
  if (facts.cpu_quota > 0) out << ", a CPU quota of " << facts.cpu_quota;
  out << ")";
  return out.str();
}

}  // namespace lt
