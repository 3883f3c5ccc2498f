// How many threads the pool gets when nobody says: one per core this process may actually use.
//
// std::thread::hardware_concurrency() counts every logical CPU of the machine. That is too many where
// the process may run on fewer of them (taskset, a cpuset, an MPI launcher that binds its ranks), where
// a container's CPU quota throttles it (docker --cpus), where SMT makes two logical CPUs of one core
// (the two threads would share its FMA units and the L2 that the GEMM sizes its blocks for), and where a
// launcher started several processes on one machine that each take all of it. Each of these runs
// more threads than cores: a thread that loses its core stalls every fork-join it is part of.
#pragma once
#include <string>

namespace lt {

// What this machine and its operating system give the process to run on.
struct CoreFacts {
  int allowed_cpus = 1;   // logical CPUs in the process's affinity mask
  int allowed_cores = 1;  // the physical cores they belong to (SMT siblings counted once)
  int available_cpus = 1;  // logical CPUs it could be given: its cgroup's cpuset, else the machine's online ones
  double cpu_quota = 0;   // the cgroup's CPU limit, in CPUs; 0 when there is none
};

// Read from sched_getaffinity, /sys/devices/system/cpu/cpuN/topology, and the cgroup's cpuset and
// quota (v2: cpuset.cpus.effective, cpu.max; v1: cpuset.effective_cpus, cpu.cfs_quota_us over
// cpu.cfs_period_us); what cannot be read counts as no restriction.
CoreFacts read_core_facts();

// One thread per allowed core, at most the quota rounded up. `processes` is how many processes a launcher
// started together on this machine: when this one was not bound to cores of its own (its mask holds
// every available CPU), it takes its share of them. At least 1.
int default_threads(const CoreFacts& facts, int processes);

// default_threads for this machine, its facts read once.
int default_threads(int processes = 1);

// A cgroup v2 cpu.max ("200000 100000": 2 CPUs; "max 100000": none) in CPUs, 0 for none or unreadable.
double parse_cpu_max(const std::string& text);
// How many CPUs a kernel CPU list names ("0-3,8,10-11": 7), 0 if it is empty or malformed.
int count_cpu_list(const std::string& text);

// The facts in words, for `lingtrain version`: "2 cores (2 of 2 CPUs in the affinity mask)", and the
// quota where there is one.
std::string describe_core_facts(const CoreFacts& facts);

}  // namespace lt
