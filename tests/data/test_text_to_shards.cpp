#include <gtest/gtest.h>

#include <filesystem>

#include "data/shard.h"
#include "data/text_to_shards.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

TEST(TextToShards, FilesBecomeEosSeparatedDocumentsAcrossShards) {
  test::TempDir dir;
  test::write_raw_file(dir.path("a.txt"), "hello");
  test::write_raw_file(dir.path("b.txt"), "wörld");
  const ByteTokenizer tokenizer;
  const ShardsWritten written =
      text_files_to_shards({dir.path("a.txt"), dir.path("b.txt")}, tokenizer, dir.path("out/text"), 4);
  EXPECT_EQ(written.documents, 2);
  EXPECT_EQ(written.tokens, 1 + 5 + 1 + 6);
  ASSERT_EQ(written.paths.size(), 4u);
  EXPECT_EQ(written.paths[0], dir.path("out/text_000000.bin"));
  EXPECT_EQ(written.paths[3], dir.path("out/text_000003.bin"));

  std::vector<uint32_t> stream;
  for (const std::string& path : written.paths) {
    const std::vector<uint32_t> tokens = read_token_shard(path, tokenizer.vocab_size());
    EXPECT_LE(tokens.size(), 4u);
    stream.insert(stream.end(), tokens.begin(), tokens.end());
  }
  std::vector<uint32_t> expected;
  append_document_tokens(expected, "hello", tokenizer);
  append_document_tokens(expected, "wörld", tokenizer);
  EXPECT_EQ(stream, expected);
}

TEST(TextToShards, MissingInputFailsBeforeAnyShardIsWritten) {
  test::TempDir dir;
  test::write_raw_file(dir.path("a.txt"), "text");
  const std::string missing = dir.path("missing.txt");
  test::expect_error(
      [&] { text_files_to_shards({dir.path("a.txt"), missing}, ByteTokenizer(), dir.path("shards"), 2); },
      {missing, "cannot open"});
  EXPECT_FALSE(std::filesystem::exists(dir.path("shards_000000.bin")));
  test::expect_error([&] { text_files_to_shards({}, ByteTokenizer(), dir.path("shards")); }, {"no text files"});
}

}  // namespace
}  // namespace lt
