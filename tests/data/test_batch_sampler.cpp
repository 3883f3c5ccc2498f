#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "data/batch_sampler.h"
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
  EXPECT_EQ(sampler.cursor(), (SamplerCursor{0, static_cast<uint64_t>(windows)}));
  const std::set<int32_t> distinct(starts.begin(), starts.end());
  EXPECT_EQ(distinct.size(), starts.size()) << "no window twice in an epoch";
  const int32_t offset = *distinct.begin();
  EXPECT_LT(offset, T);
  for (int32_t start : distinct) EXPECT_EQ((start - offset) % T, 0);
  EXPECT_EQ(windows, (num_tokens - 1 - offset) / T) << "the grid covers the array";
  EXPECT_FALSE(std::is_sorted(starts.begin(), starts.end())) << "the order is shuffled";

  sampler.next();
  EXPECT_EQ(sampler.cursor().epoch, 1u);
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
  const SamplerCursor saved = original.cursor();
  std::vector<std::vector<int32_t>> expected;
  for (int step = 0; step < 20; ++step) expected.push_back(flatten(original.next()));
  EXPECT_GE(original.cursor().epoch, 3u);

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
  test::expect_error([&] { sampler.restore({0, 1000}); }, {"cursor position 1000 is beyond the"});
}

TEST(Sampler, HeldoutWalksEveryWindowInOrder) {
  HeldoutBatches heldout(positions(103), 4, 10);
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

}  // namespace
}  // namespace lt
