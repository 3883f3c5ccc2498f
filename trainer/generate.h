// Generation with a KV cache: the prompt fills the caches in one forward, then one token per step,
// drawn greedily (temperature 0) or from the top-k / nucleus (top-p) restricted distribution.
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
};

// Only ids below `sample_vocab` are drawn: the model's vocabulary may be padded past the tokenizer's,
// and those padding rows were never trained on.
std::vector<uint32_t> generate(LingForCausalLM& model, const std::vector<uint32_t>& prompt,
                               const SamplingSettings& settings, int64_t sample_vocab);

// How many tokens `prompt` takes in sample_text (the end-of-text token first).
int64_t sample_prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt);

// The prompt as a training document starts (end-of-text first), then the continuation, decoded.
std::string sample_text(LingForCausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const SamplingSettings& settings);

}  // namespace lt
