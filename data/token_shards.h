// A set of llm.c token shards (data/shard.h) read as one stream, in place through memory maps: a
// corpus of any size trains without being loaded, counts are 64-bit (each shard's own count stays the
// int32 of its header), and a rank touches only the pages of the windows it reads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace lt {

class TokenShards {
 public:
  // The shards `spec` names: paths and glob patterns separated by commas ("web/train_*.bin",
  // "a.bin,b.bin"), each pattern's files in sorted order. Fails with one line naming the pattern that
  // matches nothing, the file that is no shard (data/shard.h's checks), or the file whose token width
  // differs from the first one's (uint16 and uint32 shards do not mix). Every token read is checked
  // below vocab_size. random_access: the reads will be windows in a shuffled order (training), so no page
  // is brought in but those read; otherwise the kernel reads ahead (held-out data, read in order).
  static TokenShards open(const std::string& spec, int64_t vocab_size, bool random_access = false);
  // A 1-D i32 CPU tensor as one shard (tests; the tensor is shared, not copied).
  static TokenShards in_memory(Tensor tokens);

  size_t num_shards() const { return shards_->size(); }
  int64_t shard_tokens(size_t shard) const { return (*shards_)[shard].tokens; }
  const std::string& shard_path(size_t shard) const { return (*shards_)[shard].path; }
  int64_t num_tokens() const { return total_tokens_; }
  const std::string& spec() const { return spec_; }
  // "web/*.bin (3 shards, 1234567 tokens)"; one file: "train.bin (1234567 tokens)".
  std::string describe() const;

  // Tokens [start, start + count) of one shard, or of the shards end to end (crossing their boundaries),
  // as int32. A token >= vocab_size fails with "<file>: token 70000 at position 12 is >= vocab_size 65536".
  void read(size_t shard, int64_t start, int64_t count, int32_t* out) const;
  void read(int64_t start, int64_t count, int32_t* out) const;

 private:
  struct Shard {
    std::string path;
    int64_t tokens = 0;
    int token_bytes = 4;
    const uint8_t* first = nullptr;     // the first token's bytes
    std::shared_ptr<const void> owner;  // the mapping or the tensor the bytes belong to
  };
  std::string spec_;
  std::shared_ptr<const std::vector<Shard>> shards_;
  std::vector<int64_t> first_token_;  // of each shard in the stream; the last entry is the total
  int64_t total_tokens_ = 0;
  uint64_t vocab_limit_ = 0;
};

}  // namespace lt
