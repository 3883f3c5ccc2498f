// Text files to token shards (the `lingtrain shards` subcommand): each file is one document, entered
// into the token stream as append_document_tokens does (eos, then its tokens), and the stream is cut
// into llm.c shards of tokens_per_shard tokens, "<output_prefix>_000000.bin", "_000001.bin", ...
// A document may continue from one shard into the next, as in llm.c.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace lt {

inline constexpr int64_t kDefaultTokensPerShard = 100'000'000;  // llm.c's shard size

struct ShardsWritten {
  std::vector<std::string> paths;
  int64_t documents = 0;
  int64_t tokens = 0;
};

// Every input is opened before the first shard is written, so a missing or unreadable file fails with
// its name and leaves no shards behind; each shard is written atomically. Creates the folder of
// output_prefix when it does not exist.
ShardsWritten text_files_to_shards(const std::vector<std::string>& text_paths, const Tokenizer& tokenizer,
                                   const std::string& output_prefix, int64_t tokens_per_shard = kDefaultTokensPerShard);

}  // namespace lt
