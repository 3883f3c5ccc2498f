// Batched generation (trainer/generate.h): ragged prompts decoded together, each row stopping on its own,
// give what each prompt gives decoded alone.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/ling.h"
#include "tensor/random.h"
#include "tests/model/small_config.h"
#include "trainer/generate.h"

namespace lt {
namespace {

using test::small_config;

// `count` prompts of ids below 250, of lengths 1 to 37 in no order.
std::vector<std::vector<uint32_t>> ragged_prompts(int64_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<uint32_t>> prompts;
  for (int64_t r = 0; r < count; ++r) {
    std::vector<uint32_t> prompt(static_cast<size_t>(1 + (r * 13) % 37));
    for (uint32_t& id : prompt) id = static_cast<uint32_t>(rng.below(250));
    prompts.push_back(prompt);
  }
  return prompts;
}

// Rows end at different steps: by their own limit (a 64-position model, end_at_context: a longer prompt
// leaves less room), by the stop id, or by max_new_tokens. The stop id is one row 0 draws at its 6th
// token alone, so at least that row stops early. Every row must be what it is alone, token for token.
TEST(Generation, BatchedGreedyMatchesOneAtATime) {
  LingConfig config = small_config();
  config.max_position_embeddings = 64;
  int64_t compared = 0, stopped = 0;
  for (uint64_t model_seed : {3, 11, 29}) {
    LingForCausalLM model(config, model_seed);
    const std::vector<std::vector<uint32_t>> prompts = ragged_prompts(12, model_seed + 100);
    SamplingSettings greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = 40;
    greedy.end_at_context = true;
    greedy.stop_at = generate(model, prompts[0], greedy, 250).at(5);
    const std::vector<std::vector<uint32_t>> together = generate_batch(model, prompts, greedy, 250);
    ASSERT_EQ(together.size(), prompts.size());
    for (size_t r = 0; r < prompts.size(); ++r) {
      const std::vector<uint32_t> alone = generate(model, prompts[r], greedy, 250);
      EXPECT_EQ(together[r], alone) << "model " << model_seed << " row " << r;
      compared += static_cast<int64_t>(alone.size());
      stopped += !alone.empty() && alone.back() == *greedy.stop_at;
    }
  }
  EXPECT_GT(stopped, 2);
  EXPECT_GT(compared, 600);
}

// Rows that end at their first token (a limit of one, or the stop id drawn first) leave their cache row
// to the next prompt, which must start on an empty one.
TEST(Generation, RowsEndingAtTheirFirstTokenLeaveTheirCacheRow) {
  LingForCausalLM model(small_config(), 5);
  const std::vector<std::vector<uint32_t>> prompts = ragged_prompts(6, 21);
  SamplingSettings greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 1;
  const std::vector<std::vector<uint32_t>> firsts = generate_batch(model, prompts, greedy, 250);
  greedy.max_new_tokens = 10;
  greedy.stop_at = firsts[0].at(0);
  const std::vector<std::vector<uint32_t>> together = generate_batch(model, prompts, greedy, 250);
  EXPECT_EQ(together[0], firsts[0]);
  for (size_t r = 0; r < prompts.size(); ++r) {
    SamplingSettings one = greedy;
    one.max_new_tokens = 1;
    one.stop_at.reset();
    EXPECT_EQ(firsts[r], generate(model, prompts[r], one, 250)) << "row " << r;
    EXPECT_EQ(together[r], generate(model, prompts[r], greedy, 250)) << "row " << r;
  }
}

// Sampling: row r draws from its own stream (row_sampling_seed), so it gives what it gives alone under
// that seed, whatever else is decoded with it; row 0's stream is the seed itself.
TEST(Generation, BatchedSamplingDrawsEachRowFromItsOwnStream) {
  LingForCausalLM model(small_config(), 7);
  SamplingSettings sampling;
  sampling.max_new_tokens = 24;
  sampling.temperature = 1.0;
  sampling.seed = 42;
  const std::vector<std::vector<uint32_t>> prompts = ragged_prompts(5, 8);
  const std::vector<std::vector<uint32_t>> together = generate_batch(model, prompts, sampling, 250);
  EXPECT_EQ(row_sampling_seed(42, 0), 42u);
  for (size_t r = 0; r < prompts.size(); ++r) {
    SamplingSettings alone = sampling;
    alone.seed = row_sampling_seed(sampling.seed, static_cast<int64_t>(r));
    EXPECT_EQ(together[r], generate(model, prompts[r], alone, 250)) << "row " << r;
  }
  // The same prompt in every row: different streams, different continuations.
  const std::vector<std::vector<uint32_t>> same =
      generate_batch(model, std::vector<std::vector<uint32_t>>(3, prompts[1]), sampling, 250);
  EXPECT_NE(same[0], same[1]);
  EXPECT_NE(same[1], same[2]);
}

TEST(Generation, RefusesAnEmptyPromptAndTooLongARun) {
  LingConfig config = small_config();
  config.max_position_embeddings = 16;
  LingForCausalLM model(config, 1);
  SamplingSettings greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 8;
  auto error_of = [&](const std::vector<std::vector<uint32_t>>& prompts) {
    try {
      generate_batch(model, prompts, greedy, 250);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({{1, 2}, {}}).find("prompt 1 is empty"), std::string::npos);
  EXPECT_NE(error_of({{1, 2}, std::vector<uint32_t>(10, 3)}).find("max_position_embeddings"), std::string::npos);
  // end_at_context: the long row ends at the last position, a prompt filling them all gets nothing.
  greedy.end_at_context = true;
  const auto ends = generate_batch(model, {{1, 2}, std::vector<uint32_t>(10, 3), std::vector<uint32_t>(16, 4)},
                                   greedy, 250);
  EXPECT_EQ(ends[0].size(), 8u);
  EXPECT_EQ(ends[1].size(), 6u);
  EXPECT_TRUE(ends[2].empty());
}

}  // namespace
}  // namespace lt
