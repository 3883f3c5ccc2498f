#include "data/text_to_shards.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <system_error>

#include "data/shard.h"
#include "io/input_file.h"
#include "tensor/error.h"

namespace lt {

namespace {

std::string shard_path(const std::string& output_prefix, size_t index) {
  char suffix[24];
  std::snprintf(suffix, sizeof suffix, "_%06zu.bin", index);
  return output_prefix + suffix;
}

}  // namespace

ShardsWritten text_files_to_shards(const std::vector<std::string>& text_paths, const Tokenizer& tokenizer,
                                   const std::string& output_prefix, int64_t tokens_per_shard) {
  if (text_paths.empty()) fail(output_prefix, ": no text files given to make shards from");
  LT_CHECK(tokens_per_shard >= 1 && tokens_per_shard <= INT32_MAX, output_prefix, ": tokens per shard ",
           tokens_per_shard, " must be in [1, 2^31 - 1] (the shard header counts tokens in an int32)");
  for (const std::string& path : text_paths) {
    const InputFile readable(path);  // fails now, naming the file, before any shard exists
  }

  const std::filesystem::path folder = std::filesystem::path(output_prefix).parent_path();
  if (!folder.empty()) {
    std::error_code error;
    std::filesystem::create_directories(folder, error);
    if (error) fail(output_prefix, ": cannot create ", folder.string(), ": ", error.message());
  }

  ShardsWritten written;
  std::vector<uint32_t> pending;
  auto write_shard = [&](size_t count) {
    written.paths.push_back(shard_path(output_prefix, written.paths.size()));
    write_token_shard(written.paths.back(), std::span<const uint32_t>(pending.data(), count), tokenizer.vocab_size());
    pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(count));
  };
  for (const std::string& path : text_paths) {
    const size_t before = pending.size();
    append_document_tokens(pending, read_file(path), tokenizer);
    written.tokens += static_cast<int64_t>(pending.size() - before);
    ++written.documents;
    while (static_cast<int64_t>(pending.size()) >= tokens_per_shard) write_shard(static_cast<size_t>(tokens_per_shard));
  }
  if (!pending.empty()) write_shard(pending.size());
  return written;
}

}  // namespace lt
