// Generation with a KV cache: the prompts fill their rows of the caches in forwards of a few prompts of
// similar lengths together (the shorter padded), then one token per step for all rows still running
// together, drawn greedily (temperature 0) or from the top-k / nucleus (top-p) restricted distribution.
// The weights are prepared once per call (NormHead's table; on the CPU, the GEMMs' packed weights).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/ling.h"

namespace lt {

struct SamplingSettings {
  int64_t max_new_tokens = 200;
  double temperature = 0.8;  // <= 0: greedy
  int64_t top_k = 40;        // 0: no limit
  double top_p = 0.95;       // in (0, 1]
  uint64_t seed = 1;
  std::optional<uint32_t> stop_at;  // generation ends once this id is drawn (it is the last id returned)
  // Where a prompt plus max_new_tokens would pass the model's max_position_embeddings: false, an error;
  // true, that row ends at the last position (replies in conversations that grow turn by turn).
  bool end_at_context = false;
};

// The seed of row `row`'s sampling stream. Row 0 draws from `seed` itself, as one-at-a-time generation
// always has; row r > 0 from derive_seed(seed, r). A row's tokens thus depend on its index, never on
// which other rows are decoded with it.
uint64_t row_sampling_seed(uint64_t seed, int64_t row);

// The continuations of several prompts (ragged lengths), decoded together: row r stops at its own stop id
// or its own limit, and leaves the batch then. Only ids below `sample_vocab` are drawn: the model's
// vocabulary may be padded past the tokenizer's, and those padding rows were never trained on.
std::vector<std::vector<uint32_t>> generate_batch(LingForCausalLM& model,
                                                  const std::vector<std::vector<uint32_t>>& prompts,
                                                  const SamplingSettings& settings, int64_t sample_vocab);

// One prompt: generate_batch's one-row case.
std::vector<uint32_t> generate(LingForCausalLM& model, const std::vector<uint32_t>& prompt,
                               const SamplingSettings& settings, int64_t sample_vocab);

// How many tokens `prompt` takes in sample_texts (the end-of-text token first).
int64_t sample_prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt);

// `count` continuations of the prompt, decoded together, continuation c drawn from row c's stream
// (row_sampling_seed): the prompt as a training document starts (end-of-text first), then each
// continuation, decoded.
std::vector<std::string> sample_texts(LingForCausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                                      const SamplingSettings& settings, int64_t count);

}  // namespace lt
