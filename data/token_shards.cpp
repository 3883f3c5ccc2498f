#include "data/token_shards.h"

#include <glob.h>

#include <algorithm>

#include "data/shard.h"
#include "io/format_text.h"
#include "io/input_file.h"
#include "tensor/error.h"

namespace lt {

namespace {

// Tokens are ids into an int32 embedding table.
constexpr uint64_t kInt32Limit = uint64_t{1} << 31;

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    parts.push_back(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return parts;
    begin = comma + 1;
  }
}

// A pattern's files in sorted order; a plain path as it is (opening it says what is wrong with it).
std::vector<std::string> expand(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t found{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &found);
  std::vector<std::string> paths(found.gl_pathv, found.gl_pathv + found.gl_pathc);
  ::globfree(&found);
  LT_CHECK(status == 0 && !paths.empty(), pattern, ": no file matches");
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

TokenShards TokenShards::open(const std::string& spec, int64_t vocab_size, bool random_access) {
  LT_CHECK(vocab_size >= 1 && static_cast<uint64_t>(vocab_size) <= kInt32Limit, spec, ": vocab_size ", vocab_size,
           " is outside [1, 2^31], the ids int32 token tensors hold");
  auto shards = std::make_shared<std::vector<Shard>>();
  for (const std::string& pattern : split_commas(spec)) {
    LT_CHECK(!pattern.empty(), "'", spec, "': an empty file name in the list");
    for (const std::string& path : expand(pattern)) {
      const InputFile file(path);
      const ShardInfo info = read_token_shard_info(file);
      if (!shards->empty() && info.token_bytes != shards->front().token_bytes)
        fail(path, ": holds uint", 8 * info.token_bytes, " tokens, but ", shards->front().path, " holds uint",
             8 * shards->front().token_bytes, " (a shard set is one or the other)");
      auto mapped = std::make_shared<const MappedFile>(file);
      if (random_access) mapped->advise_random_access();
      Shard shard{path, info.num_tokens, info.token_bytes, mapped->bytes() + kShardHeaderBytes, mapped};
      shards->push_back(std::move(shard));
    }
  }
  TokenShards set;
  set.spec_ = spec;
  set.vocab_limit_ = static_cast<uint64_t>(vocab_size);
  set.shards_ = std::move(shards);
  for (const Shard& shard : *set.shards_) {
    set.first_token_.push_back(set.total_tokens_);
    set.total_tokens_ += shard.tokens;
  }
  set.first_token_.push_back(set.total_tokens_);
  return set;
}

TokenShards TokenShards::in_memory(Tensor tokens) {
  LT_CHECK(tokens.defined() && tokens.ndim() == 1 && tokens.dtype() == DType::I32 && tokens.is_cpu(),
           "token shards: tokens must be a 1-D i32 tensor on the CPU, got ",
           tokens.defined() ? tokens.str() : "an undefined tensor");
  auto owner = std::make_shared<const Tensor>(std::move(tokens));
  TokenShards set;
  set.spec_ = "tokens";
  set.vocab_limit_ = kInt32Limit;
  set.total_tokens_ = owner->numel();
  set.first_token_ = {0, set.total_tokens_};
  const auto* first = reinterpret_cast<const uint8_t*>(owner->data<int32_t>());
  set.shards_ = std::make_shared<const std::vector<Shard>>(
      std::vector<Shard>{{"tokens", owner->numel(), 4, first, owner}});
  return set;
}

std::string TokenShards::describe() const {
  if (num_shards() == 1) return format_text("%s (%lld tokens)", spec_.c_str(), static_cast<long long>(total_tokens_));
  return format_text("%s (%zu shards, %lld tokens)", spec_.c_str(), num_shards(),
                     static_cast<long long>(total_tokens_));
}

void TokenShards::read(size_t shard, int64_t start, int64_t count, int32_t* out) const {
  const Shard& s = (*shards_)[shard];
  LT_CHECK(start >= 0 && count >= 0 && start + count <= s.tokens, s.path, ": tokens [", start, ", ", start + count,
           ") are outside its ", s.tokens);
  decode_tokens(s.first + start * s.token_bytes, s.token_bytes, count, out, vocab_limit_, "vocab_size", s.path, start);
}

void TokenShards::read(int64_t start, int64_t count, int32_t* out) const {
  LT_CHECK(start >= 0 && count >= 0 && start + count <= total_tokens_, spec_, ": tokens [", start, ", ",
           start + count, ") are outside its ", total_tokens_);
  // The shard holding `start`: the last whose first token is <= start (empty shards are passed over).
  size_t shard = static_cast<size_t>(std::upper_bound(first_token_.begin(), first_token_.end() - 1, start) -
                                     first_token_.begin()) - 1;
  while (count > 0) {
    const int64_t within = start - first_token_[shard];
    const int64_t n = std::min(count, shard_tokens(shard) - within);
    read(shard, within, n, out);
    start += n;
    out += n;
    count -= n;
    ++shard;
  }
}

}  // namespace lt
