// libFuzzer harness for tokenizer.json (data/bpe_tokenizer.h): the JSON parse, every check of the
// loader (model, pre-tokenizer steps and their regular expressions, vocabulary, merges, added tokens),
// and, when the tokenizer loads, encoding and decoding a fixed text and the input's own bytes. Bad input
// must end in lt::Error; anything else escaping, a crash, a hang or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "data/bpe_tokenizer.h"
#include "io/json.h"
#include "tensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const lt::BpeTokenizer tokenizer = lt::BpeTokenizer::from_json(lt::parse_json(text, "tokenizer.json"), "tokenizer.json");
    for (std::string_view sample : {std::string_view("Hi <|endoftext|> 12345 Grüße 日本 🙂\n\n  x"), text}) {
      tokenizer.decode(tokenizer.encode(sample));
      tokenizer.decode(tokenizer.encode_with_special_tokens(sample));
    }
  } catch (const lt::Error&) {
  }
  return 0;
}
