#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <numeric>

#include "data/shard.h"
#include "data/token_shards.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

using test::expect_error;
using test::TempDir;

// A shard whose tokens are first, first + 1, ... (mod vocab_size).
void write_counting_shard(const std::string& path, int64_t count, uint32_t first, int64_t vocab_size) {
  std::vector<uint32_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tokens[i] = static_cast<uint32_t>((first + i) % vocab_size);
  write_token_shard(path, tokens, vocab_size);
}

std::vector<int32_t> read_stream(const TokenShards& shards, int64_t start, int64_t count) {
  std::vector<int32_t> out(static_cast<size_t>(count));
  shards.read(start, count, out.data());
  return out;
}

TEST(TokenShards, AGlobIsItsFilesInSortedOrderReadAsOneStream) {
  TempDir dir;
  write_counting_shard(dir.path("s_002.bin"), 50, 2000, 1 << 16);
  write_counting_shard(dir.path("s_000.bin"), 30, 0, 1 << 16);
  write_counting_shard(dir.path("s_001.bin"), 0, 0, 1 << 16);  // an empty shard is passed over
  write_counting_shard(dir.path("other.bin"), 10, 9000, 1 << 16);
  const TokenShards shards = TokenShards::open(dir.path("s_*.bin"), 1 << 16);
  ASSERT_EQ(shards.num_shards(), 3u);
  EXPECT_EQ(shards.shard_path(0), dir.path("s_000.bin"));
  EXPECT_EQ(shards.num_tokens(), 80);
  EXPECT_NE(shards.describe().find("(3 shards, 80 tokens)"), std::string::npos) << shards.describe();
  // Across the empty shard: 28, 29, then the third shard's 2000, 2001.
  EXPECT_EQ(read_stream(shards, 28, 4), (std::vector<int32_t>{28, 29, 2000, 2001}));
  std::vector<int32_t> one(3);
  shards.read(2, 47, 3, one.data());
  EXPECT_EQ(one, (std::vector<int32_t>{2047, 2048, 2049}));

  // A list keeps its order, and may mix files and patterns.
  const TokenShards listed = TokenShards::open(dir.path("other.bin") + "," + dir.path("s_00[0].bin"), 1 << 16);
  EXPECT_EQ(listed.num_tokens(), 40);
  EXPECT_EQ(read_stream(listed, 9, 2), (std::vector<int32_t>{9009, 0}));
}

TEST(TokenShards, BadSetsAreOneLineNamingTheFile) {
  TempDir dir;
  write_counting_shard(dir.path("narrow.bin"), 20, 0, 1000);
  write_counting_shard(dir.path("wide.bin"), 20, 0, 100000);
  expect_error([&] { TokenShards::open(dir.path("nothing_*.bin"), 1000); }, {"nothing_*.bin: no file matches"});
  expect_error([&] { TokenShards::open(dir.path("missing.bin"), 1000); }, {"missing.bin", "cannot open"});
  expect_error([&] { TokenShards::open(dir.path("narrow.bin") + "," + dir.path("wide.bin"), 100000); },
               {"wide.bin: holds uint32 tokens, but", "narrow.bin holds uint16"});
  expect_error([&] { TokenShards::open(dir.path("narrow.bin") + ",", 1000); }, {"an empty file name in the list"});
  {
    std::ofstream truncated(dir.path("truncated.bin"), std::ios::binary);
    const std::string bytes = test::read_raw_file(dir.path("narrow.bin"));
    truncated << bytes.substr(0, bytes.size() - 3);
  }
  expect_error([&] { TokenShards::open(dir.path("truncated.bin"), 1000); }, {"truncated.bin", "(truncated)"});
  // Tokens are checked as they are read: the file and the position within it.
  const TokenShards shards = TokenShards::open(dir.path("narrow.bin") + "," + dir.path("narrow.bin"), 15);
  expect_error([&] { read_stream(shards, 18, 4); }, {"narrow.bin: token 18 at position 18 is >= vocab_size 15"});
  expect_error([&] { read_stream(shards, 39, 2); }, {"are outside its 40"});
}

// Two shards of 2^30 + 2^29 uint16 tokens each (sparse files, all zeros but the last token): more tokens
// than an int32 counts, read through the maps without loading them.
TEST(TokenShards, CountsGoBeyondInt32) {
  TempDir dir;
  const int64_t per_shard = (int64_t{1} << 30) + (int64_t{1} << 29);
  for (const char* name : {"big_0.bin", "big_1.bin"}) {
    std::array<int32_t, 256> header{};
    header[0] = kShardMagicUint16;
    header[1] = kShardVersionUint16;
    header[2] = static_cast<int32_t>(per_shard);
    std::ofstream out(dir.path(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), sizeof header);
    out.seekp(static_cast<std::streamoff>(sizeof header + 2 * (per_shard - 1)));
    const uint16_t last = 7;
    out.write(reinterpret_cast<const char*>(&last), 2);
  }
  const TokenShards shards = TokenShards::open(dir.path("big_*.bin"), 50000);
  EXPECT_EQ(shards.num_tokens(), 2 * per_shard);
  EXPECT_GT(shards.num_tokens(), int64_t{1} << 31);
  EXPECT_EQ(read_stream(shards, 2 * per_shard - 3, 3), (std::vector<int32_t>{0, 0, 7}));
}

}  // namespace
}  // namespace lt
