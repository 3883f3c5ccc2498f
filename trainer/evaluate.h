// Held-out evaluation: the mean next-token cross-entropy of a model over a whole token array, and the
// log-probability a model gives to the marked tokens of one sequence (`lingtrain score`) or of each of
// many packed sequences (DPO's reference, multiple-choice scoring).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/packing.h"
#include "data/token_shards.h"
#include "model/ling.h"

namespace lt {

struct LossSum {
  double sum = 0;  // nats, summed over predicted tokens
  int64_t tokens = 0;
  double mean() const { return tokens ? sum / static_cast<double>(tokens) : 0; }
};

// Windows of T + 1 tokens start at 0, T, 2T, ... of the shards end to end, so every token after the first
// is predicted exactly once; a final shorter window counts when it holds at least 2 tokens. Language-model
// loss only (no auxiliary losses), no gradients, `batch` windows per forward. limit_tokens > 0: over the
// first limit_tokens tokens only.
LossSum evaluate(LingForCausalLM& model, const TokenShards& tokens, int64_t T, int64_t batch, int64_t limit_tokens = 0);

struct SequenceLogprob {
  double logp = 0;  // nats, summed over the marked tokens
  int64_t tokens = 0;
};
// Each token of ids whose mask is 1 (the first token is never predicted, so its mask must be 0), predicted
// from the tokens before it: the sum of their log-probabilities and their count. Through the training
// loss (the fused NormHead cross-entropy), so it is the quantity SFT and DPO train on. Fails when the
// sequence is longer than max_position_embeddings. `what` names the sequence in errors (file:line).
SequenceLogprob masked_logprob(LingForCausalLM& model, std::span<const uint32_t> ids, std::span<const uint8_t> mask,
                               const std::string& what);

// The log-prob `model` gives each of the packed sequences over its counted tokens (the DPO log-prob; the
// labelled ones where a sequence has no DPO mask), indexed by sequence: `sequences` entries. No gradients;
// rows go `batch` at a time.
std::vector<double> packed_sequence_logprobs(LingForCausalLM& model, const std::vector<PackedRow>& rows,
                                             int64_t sequences, int64_t batch);

}  // namespace lt
