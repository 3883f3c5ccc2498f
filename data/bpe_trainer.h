// Training a byte-level BPE tokenizer (`lingtrain tokenizer train`): the texts are pre-tokenised with the
// chosen pattern, and the most frequent adjacent pair of symbols is merged into a new token, over and
// over, until the vocabulary is full. The result is a Hugging Face tokenizer.json that BpeTokenizer
// (and Hugging Face's libraries) load.
//
// Ids: 0-255 are the 256 bytes (byte b has id b), then the merges in the order they were learned, then
// the special tokens. Ties between equally frequent pairs go to the pair of smaller ids (left, then
// right), so training is deterministic. A pair seen fewer than twice is never merged: the vocabulary
// may come out smaller than asked when the texts are small.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/json.h"

namespace lt {

struct BpeTrainSettings {
  int64_t vocab_size = 4096;  // bytes + merges + special tokens
  std::string pattern = "ling";  // named_pre_tokenizer(): gpt2, llama3 or ling
  std::vector<std::string> special_tokens{"<|endoftext|>", "<role>", "</role>"};
};

// The tokenizer.json.
Json train_bpe(const std::vector<std::string_view>& texts, const BpeTrainSettings& settings);

}  // namespace lt
