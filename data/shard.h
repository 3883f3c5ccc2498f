// Token shards in llm.c's .bin format, so shards made by llm.c's data scripts (fineweb, tinyshakespeare)
// train here and ours train there:
//
//   header: 256 little-endian int32; [0] magic, [1] version, [2] token count, the rest zero
//     magic 20240520, version 1: tokens are uint16 (GPT-2-sized vocabularies, <= 65536)
//     magic 20240801, version 7: tokens are uint32 (Llama-3 / Ling-sized vocabularies)
//   then the tokens, little-endian.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tensor/error.h"

namespace lt {

class InputFile;

inline constexpr int32_t kShardMagicUint16 = 20240520;
inline constexpr int32_t kShardVersionUint16 = 1;
inline constexpr int32_t kShardMagicUint32 = 20240801;
inline constexpr int32_t kShardVersionUint32 = 7;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

struct ShardInfo {
  int token_bytes = 2;     // 2 (uint16) or 4 (uint32)
  int64_t num_tokens = 0;
};

// Writes atomically, as uint16 when vocab_size <= 65536 and uint32 otherwise. Fails (naming the file
// and the position) on a token >= vocab_size, and on more tokens than the int32 count can hold.
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, int64_t vocab_size);

// Reads and validates the header: magic/version pair, a non-negative count, and a file size of exactly
// header + count tokens.
ShardInfo read_token_shard_info(const std::string& path);
ShardInfo read_token_shard_info(const InputFile& file);

// `count` tokens of `token_bytes` little-endian bytes each, as Out, each checked below `limit`: the first
// that is not fails with "<path>: token 70000 at position 12 is >= vocab_size 65536" (its position is
// first_position + its index; limit_name: "vocab_size").
template <class Out>
void decode_tokens(const uint8_t* bytes, int token_bytes, int64_t count, Out* out, uint64_t limit,
                   const char* limit_name, const std::string& path, int64_t first_position) {
  for (int64_t i = 0; i < count; ++i) {
    uint32_t token;
    if (token_bytes == 2) {
      uint16_t narrow;
      std::memcpy(&narrow, bytes + 2 * i, 2);
      token = narrow;
    } else {
      std::memcpy(&token, bytes + 4 * i, 4);
    }
    if (token >= limit)
      fail(path, ": token ", token, " at position ", first_position + i, " is >= ", limit_name, ' ', limit);
    out[i] = static_cast<Out>(token);
  }
}

// Reads the tokens. With vocab_size, every token must be below it; the first that is not fails with
// "<path>: token 70000 at position 12 is >= vocab_size 65536". (Training reads shards in place:
// data/token_shards.h.)
std::vector<uint32_t> read_token_shard(const std::string& path, std::optional<int64_t> vocab_size = std::nullopt);

}  // namespace lt
