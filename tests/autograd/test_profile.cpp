// The per-op profiler: off by default and silent then; on, it records every op's forward and
// backward, and nested scopes count their own time only.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "autograd/profile.h"
#include "model/ling.h"
#include "tensor/threadpool.h"

namespace lt {
namespace {

// Turns the profiler on for one test and leaves it off and empty afterwards, whatever happens.
class ProfilerOn {
 public:
  ProfilerOn() {
    profile::reset();
    profile::enable();
  }
  ~ProfilerOn() {
    profile::disable();
    profile::reset();
  }
};

void tiny_model_step() {
  LingForCausalLM model(preset_config("tiny"), 1);
  const Tensor ids = Tensor::from_vector<int32_t>({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  const Tensor targets = Tensor::from_vector<int32_t>({2, 4}, {2, 3, 4, 5, 6, 7, 8, 9});
  MoEContext context;
  model.loss(ids, targets, context).total.backward();
}

const profile::OpTime* find(const std::vector<profile::OpTime>& ops, const std::string& name, profile::Phase phase) {
  for (const profile::OpTime& op : ops)
    if (op.name == name && op.phase == phase) return &op;
  return nullptr;
}

TEST(Profile, RecordsForwardAndBackwardOfEachOp) {
  ProfilerOn on;
  tiny_model_step();
  const std::vector<profile::OpTime> ops = profile::report();
  for (const profile::Phase phase : {profile::Phase::Forward, profile::Phase::Backward}) {
    const profile::OpTime* matmul = find(ops, "matmul", phase);
    ASSERT_NE(matmul, nullptr) << profile::phase_name(phase);
    EXPECT_GT(matmul->calls, 0);
    EXPECT_GT(matmul->seconds, 0.0) << "recorded calls took no time";
  }
  EXPECT_NE(find(ops, "grouped_matmul", profile::Phase::Forward), nullptr);
  EXPECT_NE(find(ops, "normhead_cross_entropy", profile::Phase::Backward), nullptr);
  for (size_t i = 1; i < ops.size(); ++i) EXPECT_GE(ops[i - 1].seconds, ops[i].seconds) << "sorted by time";
}

// The threads' waits at the end of a fork-join go to the scope that forked it, not to the scopes around it.
TEST(Profile, ForkJoinWaitsGoToTheirOwnScope) {
  const int original_threads = num_threads();
  set_num_threads(2);
  {
    ProfilerOn on;
    {
      LT_PROFILE_SCOPE("outer");
      LT_PROFILE_SCOPE("uneven");
      // Two slabs, the worker's 20 ms longer: the caller waits at least that long for it.
      parallel_for_slabs(2, 1, [](int64_t begin, int64_t) {
        if (begin == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      });
    }
    const std::vector<profile::OpTime> ops = profile::report();
    const profile::OpTime* outer = find(ops, "outer", profile::Phase::Forward);
    const profile::OpTime* uneven = find(ops, "uneven", profile::Phase::Forward);
    ASSERT_NE(outer, nullptr);
    ASSERT_NE(uneven, nullptr);
    EXPECT_GE(uneven->wait_seconds, 0.020);
    EXPECT_LT(uneven->wait_seconds, 10.0);
    EXPECT_EQ(outer->wait_seconds, 0.0) << "the nested scope's wait is not the outer one's";
  }
  set_num_threads(original_threads);
}

TEST(Profile, DisabledRecordsNothing) {
  profile::reset();
  ASSERT_FALSE(profile::enabled());
  tiny_model_step();
  EXPECT_TRUE(profile::report().empty());
}

TEST(Profile, NestedScopesCountSelfTime) {
  ProfilerOn on;
  {
    LT_PROFILE_SCOPE("outer");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    LT_PROFILE_SCOPE("inner");
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const std::vector<profile::OpTime> ops = profile::report();
  const profile::OpTime* outer = find(ops, "outer", profile::Phase::Forward);
  const profile::OpTime* inner = find(ops, "inner", profile::Phase::Forward);
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr);
  EXPECT_GE(inner->seconds, 0.030);
  EXPECT_LT(outer->seconds, inner->seconds) << "the outer scope's own time excludes the inner one";
  EXPECT_EQ(outer->calls, 1);
}

}  // namespace
}  // namespace lt
