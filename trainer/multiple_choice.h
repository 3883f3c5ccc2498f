// Multiple-choice accuracy (HellaSwag-style, as lm-evaluation-harness scores it): each choice's summed
// log-probability given the context (data/multiple_choice.h builds the sequences), `acc` when the largest
// sum is the labelled choice, `acc_norm` when the largest sum divided by the choice's length in characters
// is. The forwards are packed (several choices and items per row, each attending only to itself) and go
// `batch` rows at a time. Nothing here communicates: under mpirun any rank may call it alone, as long as its
// model is whole (no expert parallelism, no parameter sharding, whose forwards are collective).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "data/multiple_choice.h"
#include "data/tokenizer.h"
#include "io/json.h"
#include "model/ling.h"

namespace lt {

struct MultipleChoiceSettings {
  int64_t shots = 0;  // solved examples before each item's context (data/multiple_choice.h, few_shot_context)
  // Where the examples come from; null: the items themselves, an item never being its own example.
  const std::vector<MultipleChoiceItem>* fewshot_pool = nullptr;
  uint64_t seed = 1234;  // the examples' draw (the harness's default seed)
  int64_t batch = 8;     // packed rows per forward
  // Called as items are scored, in order: how many so far and how many of those `acc` counts right.
  std::function<void(int64_t items_done, int64_t correct)> on_progress = nullptr;
};

struct MultipleChoiceScore {
  std::vector<double> logprobs;  // per choice: the summed log-probability of its tokens, nats
  int64_t predicted = 0;         // argmax of logprobs (the first of equals, as numpy's argmax)
  int64_t predicted_norm = 0;    // argmax of logprobs / characters of the choice
  bool truncated = false;        // the start of the context did not fit the model's positions
};

struct MultipleChoiceResult {
  double acc = 0, acc_norm = 0;
  double chance = 0;  // the accuracy of guessing: the mean of 1 / choices
  int64_t n = 0, truncated = 0, shots = 0;
  std::vector<MultipleChoiceScore> items;  // per item, in order
  // acc, acc_norm, n, truncated, shots, chance.
  Json summary() const;
};

MultipleChoiceResult evaluate_multiple_choice(LingForCausalLM& model, const Tokenizer& tokenizer,
                                              const std::vector<MultipleChoiceItem>& items,
                                              const MultipleChoiceSettings& settings = {});

}  // namespace lt
