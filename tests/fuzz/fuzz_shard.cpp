// libFuzzer harness for the llm.c token shard reader (data/shard.h), both as a token vector and as the
// i32 tensor training reads, with the byte vocabulary's size and with a uint32-sized one. Bad input must
// end in lt::Error; anything else escaping, a crash, a hang or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>

#include "data/shard.h"
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
  try {
    lt::read_token_shard_tensor(path, kByteVocabulary);
  } catch (const lt::Error&) {
  }
  try {
    lt::read_token_shard_tensor(path, kLingVocabulary);
  } catch (const lt::Error&) {
  }
  return 0;
}
