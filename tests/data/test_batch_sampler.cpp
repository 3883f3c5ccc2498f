#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "data/batch_sampler.h"
#include "data/shard.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

// Tokens equal to their positions, so a row's first input names its window start.
Tensor positions(int64_t count) {
  std::vector<int32_t> values(count);
  std::iota(values.begin(), values.end(), 0);
  return Tensor::from_vector<int32_t>({count}, values);
}

std::vector<int32_t> flatten(const TokenBatch& batch) {
  std::vector<int32_t> values = batch.inputs.to_vector<int32_t>();
  const std::vector<int32_t> targets = batch.targets.to_vector<int32_t>();
  values.insert(values.end(), targets.begin(), targets.end());
  return values;
}

TEST(Sampler, RowsAreWindowsAndTargetsAreShiftedInputs) {
  const int64_t B = 3, T = 8;
  BatchSampler sampler(positions(1000), B, T, 1);
  for (int step = 0; step < 20; ++step) {
    const TokenBatch batch = sampler.next();
    ASSERT_EQ(batch.inputs.shape(), (Shape{B, T}));
    ASSERT_EQ(batch.targets.shape(), (Shape{B, T}));
    const std::vector<int32_t> inputs = batch.inputs.to_vector<int32_t>(), targets = batch.targets.to_vector<int32_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(inputs[b * T + t], inputs[b * T] + t) << "a row is consecutive tokens";
        EXPECT_EQ(targets[b * T + t], inputs[b * T + t] + 1) << "targets are the next tokens";
      }
  }
}

TEST(Sampler, EachEpochVisitsEveryWindowOnceInShuffledOrder) {
  const int64_t T = 10, num_tokens = 1001;
  BatchSampler sampler(positions(num_tokens), 1, T, 3);
  const int64_t windows = sampler.windows_in_epoch();
  std::vector<int32_t> starts;
  for (int64_t i = 0; i < windows; ++i) starts.push_back(sampler.next().inputs.to_vector<int32_t>()[0]);
  EXPECT_EQ(sampler.cursor(), (DataCursor{{0, static_cast<uint64_t>(windows), static_cast<uint64_t>(windows)}}));
  const std::set<int32_t> distinct(starts.begin(), starts.end());
  EXPECT_EQ(distinct.size(), starts.size()) << "no window twice in an epoch";
  const int32_t offset = *distinct.begin();
  EXPECT_LT(offset, T);
  for (int32_t start : distinct) EXPECT_EQ((start - offset) % T, 0);
  EXPECT_EQ(windows, (num_tokens - 1 - offset) / T) << "the grid covers the array";
  EXPECT_FALSE(std::is_sorted(starts.begin(), starts.end())) << "the order is shuffled";

  sampler.next();
  EXPECT_EQ(sampler.cursor()[0].epoch, 1u);
}

TEST(Sampler, SameSeedSameBatchesOtherSeedOtherBatches) {
  BatchSampler a(positions(5000), 4, 16, 77), b(positions(5000), 4, 16, 77), c(positions(5000), 4, 16, 78);
  bool any_difference = false;
  for (int step = 0; step < 50; ++step) {
    const std::vector<int32_t> from_a = flatten(a.next());
    EXPECT_EQ(from_a, flatten(b.next()));
    any_difference |= from_a != flatten(c.next());
  }
  EXPECT_TRUE(any_difference);
}

TEST(Sampler, RestoredCursorContinuesExactlyAcrossEpochs) {
  // 200 tokens at T = 8 give about 24 windows: 7 batches of 4 cross an epoch boundary.
  BatchSampler original(positions(200), 4, 8, 5);
  for (int step = 0; step < 5; ++step) original.next();
  const DataCursor saved = original.cursor();
  std::vector<std::vector<int32_t>> expected;
  for (int step = 0; step < 20; ++step) expected.push_back(flatten(original.next()));
  EXPECT_GE(original.cursor()[0].epoch, 3u);

  BatchSampler resumed(positions(200), 4, 8, 5);
  resumed.restore(saved);
  EXPECT_EQ(resumed.cursor(), saved);
  for (int step = 0; step < 20; ++step) EXPECT_EQ(flatten(resumed.next()), expected[step]) << "step " << step;
  EXPECT_EQ(resumed.cursor(), original.cursor());
}

TEST(Sampler, RanksSplitTheGlobalBatch) {
  BatchSampler whole(positions(4000), 6, 12, 9);
  BatchSampler rank0(positions(4000), 3, 12, 9, 0, 2), rank1(positions(4000), 3, 12, 9, 1, 2);
  for (int step = 0; step < 10; ++step) {
    const std::vector<int32_t> global = whole.next().inputs.to_vector<int32_t>();
    const std::vector<int32_t> first = rank0.next().inputs.to_vector<int32_t>();
    const std::vector<int32_t> second = rank1.next().inputs.to_vector<int32_t>();
    EXPECT_TRUE(std::equal(first.begin(), first.end(), global.begin()));
    EXPECT_TRUE(std::equal(second.begin(), second.end(), global.begin() + 3 * 12));
  }
  EXPECT_EQ(rank0.cursor(), whole.cursor());
}

TEST(Sampler, BadArgumentsAreClearErrors) {
  test::expect_error([] { BatchSampler(positions(8), 1, 8, 0); }, {"8 tokens are too few for sequence length 8"});
  test::expect_error([] { BatchSampler(Tensor::zeros({100}), 1, 8, 0); }, {"1-D i32 tensor", "f32[100]"});
  test::expect_error([] { BatchSampler(positions(100), 0, 8, 0); }, {"must be positive"});
  test::expect_error([] { BatchSampler(positions(100), 1, 8, 0, 2, 2); }, {"rank 2 is outside world size 2"});
  BatchSampler sampler(positions(100), 1, 8, 0);
  test::expect_error([&] { sampler.restore({{0, 1000}}); }, {"cursor position 1000 is beyond the"});
  test::expect_error([&] { sampler.restore({{}, {}}); }, {"the cursor has 2 sources, the data 1"});
}

TEST(Sampler, HeldoutWalksEveryWindowInOrder) {
  HeldoutBatches heldout(TokenShards::in_memory(positions(103)), 4, 10);
  EXPECT_EQ(heldout.num_windows(), 10);
  std::vector<int32_t> starts;
  int batches = 0;
  while (const std::optional<TokenBatch> batch = heldout.next()) {
    ++batches;
    const std::vector<int32_t> inputs = batch->inputs.to_vector<int32_t>();
    const std::vector<int32_t> targets = batch->targets.to_vector<int32_t>();
    for (int64_t row = 0; row < batch->inputs.dim(0); ++row) {
      starts.push_back(inputs[row * 10]);
      EXPECT_EQ(targets[row * 10 + 9], inputs[row * 10] + 10);
    }
  }
  EXPECT_EQ(batches, 3) << "4 + 4 + 2 windows";
  EXPECT_EQ(starts, (std::vector<int32_t>{0, 10, 20, 30, 40, 50, 60, 70, 80, 90}));
  heldout.reset();
  EXPECT_EQ(heldout.next()->inputs.to_vector<int32_t>()[0], 0);
}

// Tokens first, first + 1, ... as a source of its own.
SamplerSource counting_source(const std::string& name, int64_t count, int32_t first, double weight) {
  std::vector<int32_t> values(static_cast<size_t>(count));
  std::iota(values.begin(), values.end(), first);
  return {name, TokenShards::in_memory(Tensor::from_vector<int32_t>({count}, values)), weight};
}

TEST(Sampler, ShardsOfASetAreVisitedWindowByWindowWithoutCrossingThem) {
  test::TempDir dir;
  // Three shards of tokens 0.., 10000.., 20000..: a window's tokens are consecutive within one shard.
  for (int s = 0; s < 3; ++s) {
    std::vector<uint32_t> tokens(static_cast<size_t>(200 + 57 * s));
    std::iota(tokens.begin(), tokens.end(), static_cast<uint32_t>(10000 * s));
    write_token_shard(dir.path("part_" + std::to_string(s) + ".bin"), tokens, 1 << 17);
  }
  const int64_t T = 16;
  BatchSampler sampler({{"", TokenShards::open(dir.path("part_*.bin"), 1 << 17), 1.0}}, 1, T, 4);
  const int64_t windows = sampler.windows_in_epoch();
  std::set<int32_t> starts;
  for (int64_t i = 0; i < windows; ++i) {
    const TokenBatch batch = sampler.next();
    const std::vector<int32_t> inputs = batch.inputs.to_vector<int32_t>(), targets = batch.targets.to_vector<int32_t>();
    EXPECT_EQ(targets[T - 1], inputs[0] + T) << "one shard's consecutive tokens";
    starts.insert(inputs[0]);
  }
  EXPECT_EQ(static_cast<int64_t>(starts.size()), windows) << "every window once";
  for (int s = 0; s < 3; ++s) {
    const auto in_shard = std::count_if(starts.begin(), starts.end(), [s](int32_t t) { return t / 10000 == s; });
    EXPECT_GE(in_shard, (200 + 57 * s - T) / T - 1) << "shard " << s << " gives all its windows";
  }
  EXPECT_EQ(sampler.cursor()[0].epoch, 0u);
  sampler.next();
  EXPECT_EQ(sampler.cursor()[0].epoch, 1u);
}

TEST(Sampler, OneShardFileGivesTheBatchesOfItsTokensInMemory) {
  test::TempDir dir;
  std::vector<uint32_t> tokens(3000);
  std::iota(tokens.begin(), tokens.end(), 0u);
  write_token_shard(dir.path("one.bin"), tokens, 1 << 16);
  BatchSampler from_file({{"", TokenShards::open(dir.path("one.bin"), 1 << 16), 1.0}}, 4, 32, 11);
  BatchSampler in_memory(positions(3000), 4, 32, 11);
  for (int step = 0; step < 60; ++step) EXPECT_EQ(flatten(from_file.next()), flatten(in_memory.next())) << step;
}

TEST(Sampler, RestoredCursorContinuesMidShardAcrossShardsAndEpochs) {
  std::vector<SamplerSource> shards;
  test::TempDir dir;
  for (int s = 0; s < 4; ++s) {
    std::vector<uint32_t> tokens(static_cast<size_t>(90 + 31 * s));
    std::iota(tokens.begin(), tokens.end(), static_cast<uint32_t>(1000 * s));
    write_token_shard(dir.path("p" + std::to_string(s) + ".bin"), tokens, 1 << 16);
  }
  auto make = [&] { return BatchSampler({{"", TokenShards::open(dir.path("p*.bin"), 1 << 16), 1.0}}, 3, 8, 5); };
  for (int cut : {1, 4, 9, 17}) {
    BatchSampler original = make();
    for (int step = 0; step < cut; ++step) original.next();
    const DataCursor saved = original.cursor();
    std::vector<std::vector<int32_t>> expected;
    for (int step = 0; step < 40; ++step) expected.push_back(flatten(original.next()));
    BatchSampler resumed = make();
    resumed.restore(saved);
    for (int step = 0; step < 40; ++step) ASSERT_EQ(flatten(resumed.next()), expected[step]) << cut << " " << step;
    EXPECT_GE(resumed.cursor()[0].epoch, 1u);
  }
}

TEST(Sampler, AMixtureKeepsEverySourceWithinOneWindowOfItsWeight) {
  const std::vector<double> weights = {0.6, 0.3, 0.1};
  auto make = [&](uint64_t seed, int rank, int world, int64_t B) {
    std::vector<SamplerSource> sources;
    for (int s = 0; s < 3; ++s)
      sources.push_back(counting_source("s" + std::to_string(s), 400 + 300 * s, 100000 * s, weights[s]));
    return BatchSampler(std::move(sources), B, 10, seed, rank, world);
  };
  BatchSampler sampler = make(3, 0, 1, 5);
  std::vector<int64_t> rows(3, 0);
  for (int step = 1; step <= 200; ++step) {
    const std::vector<int32_t> inputs = sampler.next().inputs.to_vector<int32_t>();
    for (int64_t row = 0; row < 5; ++row) ++rows[inputs[row * 10] / 100000];
    const DataCursor cursor = sampler.cursor();
    for (int s = 0; s < 3; ++s) {
      EXPECT_EQ(static_cast<int64_t>(cursor[s].given), rows[s]) << "the cursor counts the rows a source gave";
      EXPECT_LE(std::abs(static_cast<double>(rows[s]) - weights[s] * 5 * step), 1.0) << "step " << step;
    }
  }
  EXPECT_GT(sampler.cursor()[0].epoch, 2u) << "a source that runs out repeats";

  // Other seeds shuffle each source otherwise; ranks split the global batch; a cursor restores exactly.
  BatchSampler a = make(3, 0, 1, 6), b = make(4, 0, 1, 6), rank1 = make(3, 1, 2, 3);
  bool differs = false;
  for (int step = 0; step < 10; ++step) {
    const std::vector<int32_t> whole = a.next().inputs.to_vector<int32_t>();
    differs |= whole != b.next().inputs.to_vector<int32_t>();
    EXPECT_EQ(rank1.next().inputs.to_vector<int32_t>(), std::vector<int32_t>(whole.begin() + 30, whole.end()));
  }
  EXPECT_TRUE(differs);
  BatchSampler resumed = make(3, 0, 1, 6);
  resumed.restore(a.cursor());
  for (int step = 0; step < 30; ++step) ASSERT_EQ(flatten(resumed.next()), flatten(a.next())) << step;
}

TEST(Sampler, FirstExhaustionIsWhenASourceWouldStartItsSecondEpoch) {
  std::vector<SamplerSource> sources = {counting_source("big", 5000, 0, 0.5),
                                        counting_source("small", 800, 100000, 0.5)};
  BatchSampler sampler(std::move(sources), 1, 10, 8);
  const BatchSampler::Exhaustion first = sampler.first_exhaustion();
  EXPECT_EQ(first.source, "small");
  // At equal weights the sources alternate, the first one first: after 2W windows "small" has given its W,
  // "big" takes one more, and the next is small's second epoch.
  EXPECT_EQ(first.windows, 2 * sampler.windows_in_epoch(1) + 1);
  for (int64_t i = 0; i < first.windows; ++i) sampler.next();
  EXPECT_EQ(sampler.cursor()[1].epoch, 0u);
  EXPECT_EQ(sampler.first_exhaustion().windows, 0);
  sampler.next();
  EXPECT_EQ(sampler.cursor()[1].epoch, 1u);
}

}  // namespace
}  // namespace lt
