#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "data/shard.h"
#include "data/token_shards.h"
#include "tensor/random.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

using test::expect_error;
using test::read_raw_file;
using test::TempDir;
using test::write_raw_file;

std::vector<uint32_t> random_tokens(size_t count, uint64_t vocab_size, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint32_t> tokens(count);
  for (uint32_t& token : tokens) token = static_cast<uint32_t>(rng.below(vocab_size));
  tokens.back() = static_cast<uint32_t>(vocab_size - 1);  // the largest id must survive the round trip
  return tokens;
}

std::array<int32_t, 256> header_of(const std::string& bytes) {
  std::array<int32_t, 256> header{};
  std::memcpy(header.data(), bytes.data(), sizeof header);
  return header;
}

std::string shard_bytes(int32_t magic, int32_t version, int32_t count, const std::string& payload) {
  std::array<int32_t, 256> header{};
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  return std::string(reinterpret_cast<const char*>(header.data()), sizeof header) + payload;
}

TEST(Shard, RoundTripUint16) {
  TempDir dir;
  const std::string path = dir.path("train.bin");
  const std::vector<uint32_t> tokens = random_tokens(3000, 259, 1);
  write_token_shard(path, tokens, 259);
  const std::string bytes = read_raw_file(path);
  const auto header = header_of(bytes);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3000);
  EXPECT_EQ(bytes.size(), 1024u + 2 * 3000);
  uint16_t first;
  std::memcpy(&first, bytes.data() + 1024, 2);
  EXPECT_EQ(first, tokens[0]);

  EXPECT_EQ(read_token_shard(path, 259), tokens);
  const ShardInfo info = read_token_shard_info(path);
  EXPECT_EQ(info.token_bytes, 2);
  EXPECT_EQ(info.num_tokens, 3000);
  const TokenShards mapped = TokenShards::open(path, 259);
  ASSERT_EQ(mapped.num_tokens(), 3000);
  std::vector<int32_t> values(3000);
  mapped.read(0, 3000, values.data());
  EXPECT_TRUE(std::equal(values.begin(), values.end(), tokens.begin()));
}

TEST(Shard, RoundTripUint32) {
  TempDir dir;
  const std::string path = dir.path("ling.bin");
  const std::vector<uint32_t> tokens = random_tokens(2500, 126464, 2);
  write_token_shard(path, tokens, 126464);
  const std::string bytes = read_raw_file(path);
  EXPECT_EQ(header_of(bytes)[0], 20240801);
  EXPECT_EQ(header_of(bytes)[1], 7);
  EXPECT_EQ(bytes.size(), 1024u + 4 * 2500);
  EXPECT_EQ(read_token_shard(path), tokens);
  int32_t last = 0;
  TokenShards::open(path, 126464).read(2499, 1, &last);
  EXPECT_EQ(last, 126463);
}

TEST(Shard, TokenWidthFollowsVocabSize) {
  TempDir dir;
  write_token_shard(dir.path("a.bin"), std::vector<uint32_t>{65535}, 65536);
  EXPECT_EQ(read_token_shard_info(dir.path("a.bin")).token_bytes, 2);
  write_token_shard(dir.path("b.bin"), std::vector<uint32_t>{65536}, 65537);
  EXPECT_EQ(read_token_shard_info(dir.path("b.bin")).token_bytes, 4);
  EXPECT_EQ(read_token_shard(dir.path("b.bin")), std::vector<uint32_t>{65536});
  write_token_shard(dir.path("empty.bin"), {}, 259);
  EXPECT_TRUE(read_token_shard(dir.path("empty.bin")).empty());
}

TEST(Shard, OutOfVocabularyTokensNameFilePositionAndValue) {
  TempDir dir;
  const std::string path = dir.path("train.bin");
  write_token_shard(path, std::vector<uint32_t>{1, 2, 300, 4}, 1000);
  try {
    read_token_shard(path, 259);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), path + ": token 300 at position 2 is >= vocab_size 259");
  }
  expect_error([&] {
    std::vector<int32_t> all(4);
    TokenShards::open(path, 259).read(0, 4, all.data());
  }, {path, "token 300 at position 2"});
  expect_error([&] { write_token_shard(path, std::vector<uint32_t>{5, 259}, 259); },
               {path, "token 259 at position 1 is >= vocab_size 259"});
  EXPECT_EQ(read_token_shard(path).size(), 4u) << "the failed write left the old shard in place";
}

TEST(Shard, MalformedShardsAreClearErrors) {
  TempDir dir;
  const std::string path = dir.path("bad.bin");
  const std::string four_tokens(8, '\0');
  const struct {
    const char* what;
    std::string bytes;
    std::string fragment;
  } cases[] = {
      {"shorter than the header", std::string(100, '\0'), "shorter than the 1024-byte header"},
      {"wrong magic", shard_bytes(12345, 1, 4, four_tokens), "not a token shard: magic 12345"},
      {"wrong version", shard_bytes(20240520, 2, 4, four_tokens), "unsupported shard version 2 for magic 20240520"},
      {"negative count", shard_bytes(20240520, 1, -4, four_tokens), "token count -4 is negative"},
      {"truncated tokens", shard_bytes(20240520, 1, 5, four_tokens), "header says 5 tokens of 2 bytes (1034 bytes"},
      {"extra bytes", shard_bytes(20240801, 7, 1, four_tokens), "header says 1 tokens of 4 bytes (1028 bytes"},
  };
  for (const auto& malformed : cases) {
    SCOPED_TRACE(malformed.what);
    write_raw_file(path, malformed.bytes);
    expect_error([&] { read_token_shard(path); }, {path + ": ", malformed.fragment});
    expect_error([&] { TokenShards::open(path, 259); }, {path + ": ", malformed.fragment});
  }
  expect_error([&] { read_token_shard(dir.path("absent.bin")); }, {dir.path("absent.bin"), "cannot open"});
  write_raw_file(path, shard_bytes(20240520, 1, 4, four_tokens));
  EXPECT_EQ(read_token_shard(path), std::vector<uint32_t>(4, 0));
}

}  // namespace
}  // namespace lt
