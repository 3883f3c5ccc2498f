// libFuzzer harness for the llm.c token shard reader (data/shard.h), as a token vector and as a shard set
// read through its memory map the way training reads windows (data/token_shards.h), with the byte
// vocabulary's size and with a uint32-sized one. Bad input must
// end in lt::Error; anything else escaping, a crash, a hang or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>

#include "data/shard.h"
#include "data/token_shards.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lt::fuzz::write_input(data, size);
  constexpr int64_t kByteVocabulary = 257;
  constexpr int64_t kLingVocabulary = 126464;
  try {
    lt::read_token_shard_info(path);
  } catch (const lt::Error&) {
  }
  try {
    lt::read_token_shard(path);
  } catch (const lt::Error&) {
  }
  for (int64_t vocabulary : {kByteVocabulary, kLingVocabulary}) {
    try {
      const lt::TokenShards shards = lt::TokenShards::open(path, vocabulary);
      std::vector<int32_t> window(7);
      for (int64_t start = 0; start + 7 <= shards.num_tokens(); start += 5) shards.read(start, 7, window.data());
    } catch (const lt::Error&) {
    }
  }
  return 0;
}
