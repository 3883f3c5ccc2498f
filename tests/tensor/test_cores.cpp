// The default thread count from the machine's facts (tensor/cores.h), and the cgroup quota's parsing.
#include <gtest/gtest.h>

#include "tensor/cores.h"

namespace lt {
namespace {

CoreFacts facts(int allowed_cpus, int allowed_cores, int available_cpus, double cpu_quota = 0) {
  return CoreFacts{allowed_cpus, allowed_cores, available_cpus, cpu_quota};
}

TEST(Cores, OneThreadPerPhysicalCoreOfTheAffinityMask) {
  EXPECT_EQ(default_threads(facts(16, 8, 16), 1), 8);  // SMT: two logical CPUs per core
  EXPECT_EQ(default_threads(facts(2, 2, 2), 1), 2);
  EXPECT_EQ(default_threads(facts(1, 1, 16), 1), 1);  // taskset -c 0
  EXPECT_EQ(default_threads(facts(4, 2, 16), 1), 2);
}

TEST(Cores, TheCpuQuotaRoundedUpCapsTheThreads) {
  EXPECT_EQ(default_threads(facts(16, 16, 16, 2.0), 1), 2);
  EXPECT_EQ(default_threads(facts(16, 16, 16, 1.5), 1), 2);
  EXPECT_EQ(default_threads(facts(16, 16, 16, 0.25), 1), 1);
  EXPECT_EQ(default_threads(facts(4, 4, 16, 8.0), 1), 4);  // the mask is tighter than the quota
}

TEST(Cores, ProcessesLaunchedTogetherShareTheCoresUnlessBound) {
  EXPECT_EQ(default_threads(facts(16, 8, 16), 2), 4);
  EXPECT_EQ(default_threads(facts(16, 8, 16), 3), 2);
  EXPECT_EQ(default_threads(facts(2, 2, 2), 4), 1);          // more processes than cores
  EXPECT_EQ(default_threads(facts(16, 16, 16, 4.0), 2), 2);  // a container's quota, shared
  EXPECT_EQ(default_threads(facts(4, 4, 16), 4), 4);         // bound to 4 cores of its own
  EXPECT_EQ(default_threads(facts(1, 1, 16), 2), 1);         // bound to one
}

TEST(Cores, CpuMaxParsesAsCpus) {
  EXPECT_DOUBLE_EQ(parse_cpu_max("200000 100000\n"), 2.0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("150000 100000"), 1.5);
  EXPECT_DOUBLE_EQ(parse_cpu_max("max 100000\n"), 0);
  EXPECT_DOUBLE_EQ(parse_cpu_max(""), 0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("0 100000"), 0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("lots 100000"), 0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("100000 0"), 0);
}

TEST(Cores, CpuListsCount) {
  EXPECT_EQ(count_cpu_list("0-1\n"), 2);
  EXPECT_EQ(count_cpu_list("0-3,8,10-11"), 7);
  EXPECT_EQ(count_cpu_list("5"), 1);
  EXPECT_EQ(count_cpu_list(""), 0);
  EXPECT_EQ(count_cpu_list("3-1"), 0);
  EXPECT_EQ(count_cpu_list("a-b"), 0);
}

TEST(Cores, ThisMachinesFactsAreConsistent) {
  const CoreFacts here = read_core_facts();
  EXPECT_GE(here.allowed_cores, 1);
  EXPECT_LE(here.allowed_cores, here.allowed_cpus);
  EXPECT_LE(here.allowed_cpus, here.available_cpus);
  EXPECT_GE(here.cpu_quota, 0);
  EXPECT_GE(default_threads(), 1);
  EXPECT_LE(default_threads(), here.allowed_cpus);
  EXPECT_NE(describe_core_facts(here).find("CPUs in the affinity mask"), std::string::npos);
}

}  // namespace
}  // namespace lt
