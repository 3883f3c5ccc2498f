#include "data/shard.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>

#include "io/atomic_file.h"
#include "io/input_file.h"
#include "tensor/error.h"

namespace lt {

static_assert(std::endian::native == std::endian::little, "shards are little-endian and are copied byte for byte");

namespace {

// Tokens are converted in chunks so a shard of hundreds of millions of tokens never needs a second
// full-size buffer.
constexpr size_t kChunkTokens = 1 << 20;

void check_vocab_size(const std::string& path, int64_t vocab_size) {
  if (vocab_size < 1 || vocab_size > (int64_t{1} << 32))
    fail(path, ": vocab_size ", vocab_size, " is outside [1, 2^32], the range uint32 tokens can address");
}

ShardInfo parse_info(const InputFile& file) {
  const std::string& path = file.path();
  if (file.size() < kShardHeaderBytes)
    fail(path, ": not a token shard: ", file.size(), " bytes, shorter than the ", kShardHeaderBytes, "-byte header");
  std::array<int32_t, kShardHeaderInts> header{};
  file.read_at(0, header.data(), kShardHeaderBytes, "the header");
  const int32_t magic = header[0], version = header[1], count = header[2];

  ShardInfo info;
  if (magic == kShardMagicUint16 && version == kShardVersionUint16) {
    info.token_bytes = 2;
  } else if (magic == kShardMagicUint32 && version == kShardVersionUint32) {
    info.token_bytes = 4;
  } else if (magic == kShardMagicUint16 || magic == kShardMagicUint32) {
    fail(path, ": unsupported shard version ", version, " for magic ", magic, " (expected ",
         magic == kShardMagicUint16 ? kShardVersionUint16 : kShardVersionUint32, ")");
  } else {
    fail(path, ": not a token shard: magic ", magic, ", expected ", kShardMagicUint16, " (uint16 tokens) or ",
         kShardMagicUint32, " (uint32 tokens)");
  }
  if (count < 0) fail(path, ": header token count ", count, " is negative");
  info.num_tokens = count;

  const uint64_t expected = kShardHeaderBytes + static_cast<uint64_t>(count) * info.token_bytes;
  if (file.size() != expected)
    fail(path, ": header says ", count, " tokens of ", info.token_bytes, " bytes (", expected,
         " bytes with the header) but the file has ", file.size(), " bytes", file.size() < expected ? " (truncated)" : "");
  return info;
}

// Reads every token into out[0, num_tokens), checking each against `limit` (exclusive); `limit_name`
// says in the error which limit was broken.
template <class Out>
void read_tokens(const InputFile& file, const ShardInfo& info, Out* out, uint64_t limit, const char* limit_name) {
  std::vector<uint8_t> chunk(std::min<size_t>(kChunkTokens, info.num_tokens) * info.token_bytes);
  for (int64_t first = 0; first < info.num_tokens; first += kChunkTokens) {
    const size_t count = std::min<int64_t>(kChunkTokens, info.num_tokens - first);
    file.read_at(kShardHeaderBytes + static_cast<uint64_t>(first) * info.token_bytes, chunk.data(),
                 count * info.token_bytes, "the tokens");
    decode_tokens(chunk.data(), info.token_bytes, static_cast<int64_t>(count), out + first, limit, limit_name,
                  file.path(), first);
  }
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size) {
  check_vocab_size(path, vocab_size);
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail(path, ": ", tokens.size(), " tokens do not fit one shard (the header count is an int32); split them");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= static_cast<uint64_t>(vocab_size))
      fail(path, ": token ", tokens[i], " at position ", i, " is >= vocab_size ", vocab_size);

  const bool narrow = vocab_size <= 65536;
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = narrow ? kShardMagicUint16 : kShardMagicUint32;
  header[1] = narrow ? kShardVersionUint16 : kShardVersionUint32;
  header[2] = static_cast<int32_t>(tokens.size());

  write_file_atomic(path, [&](FileSink& sink) {
    sink.write(header.data(), kShardHeaderBytes);
    if (!narrow) {
      sink.write(tokens.data(), tokens.size_bytes());
      return;
    }
    std::vector<uint16_t> chunk;
    for (size_t first = 0; first < tokens.size(); first += kChunkTokens) {
      const size_t count = std::min(kChunkTokens, tokens.size() - first);
      chunk.assign(tokens.begin() + first, tokens.begin() + first + count);
      sink.write(chunk.data(), count * sizeof(uint16_t));
    }
  });
}

ShardInfo read_token_shard_info(const std::string& path) { return parse_info(InputFile(path)); }
ShardInfo read_token_shard_info(const InputFile& file) { return parse_info(file); }

std::vector<uint32_t> read_token_shard(const std::string& path, std::optional<int64_t> vocab_size) {
  const InputFile file(path);
  const ShardInfo info = parse_info(file);
  if (vocab_size) check_vocab_size(path, *vocab_size);
  std::vector<uint32_t> tokens(info.num_tokens);
  if (vocab_size) read_tokens(file, info, tokens.data(), static_cast<uint64_t>(*vocab_size), "vocab_size");
  else read_tokens(file, info, tokens.data(), uint64_t{1} << 32, "the uint32 limit");
  return tokens;
}

}  // namespace lt
