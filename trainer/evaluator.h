// The held-out figures of a run, each stage's own (the next-token loss; SFT's loss on the assistant
// tokens; DPO's eval_ metrics, trainer/stage_batches.h): at every --eval-every point on about the first
// --eval-tokens held-out tokens, and over all of the held-out data at the end. With --eval-mc, the
// multiple-choice accuracy too (trainer/multiple_choice.h): at its own --eval-mc-every points (or the
// held-out ones) and at the end, into the records as mc_acc, mc_acc_norm, mc_chance, mc_items and
// mc_truncated. Rank 0 evaluates (under expert parallelism and parameter sharding with the other ranks
// whose forwards are collective with it, every one scoring the same items).
#pragma once
#include <cstdint>
#include <vector>

#include "data/multiple_choice.h"
#include "data/tokenizer.h"
#include "io/json.h"
#include "trainer/stage_batches.h"

namespace lt {

// What the multiple-choice accuracy is taken on, and how often (0: at the held-out points).
struct MultipleChoiceEvaluation {
  const std::vector<MultipleChoiceItem>* items = nullptr;  // null or empty: none
  const Tokenizer* tokenizer = nullptr;
  int64_t every = 0;
};

class Evaluator {
 public:
  Evaluator(LingForCausalLM& model, bool evaluates, int64_t every, int64_t tokens,
            MultipleChoiceEvaluation multiple_choice = {})
      : model_(model), evaluates_(evaluates), every_(every), tokens_(tokens), multiple_choice_(multiple_choice) {}

  // Whether an --eval-every point lies in (step_before, step_after]: one step, or an A-EDiT round
  // that passed one (its figures are then taken at the round's end).
  bool due(int64_t step_before, int64_t step_after) const { return passed(every_, step_before, step_after); }
  // The same for the multiple-choice accuracy's points.
  bool multiple_choice_due(int64_t step_before, int64_t step_after) const {
    return scores_multiple_choice() &&
           passed(multiple_choice_.every > 0 ? multiple_choice_.every : every_, step_before, step_after);
  }
  // Whether periodic figures are taken at all (a post-training stage's "before" figures go with them).
  bool periodic() const { return evaluates_ && every_ > 0; }
  // The periodic figures into `record` (none without held-out data).
  void add_periodic(StageBatches& batches, Json& record) { add(batches, tokens_, record); }
  // The multiple-choice figures into `record` (none without --eval-mc).
  void add_multiple_choice(Json& record);
  // The figures over all of the held-out data, and the multiple-choice accuracy.
  Json all(StageBatches& batches) {
    Json figures = Json::object();
    add(batches, 0, figures);
    add_multiple_choice(figures);
    return figures;
  }

 private:
  bool scores_multiple_choice() const {
    return evaluates_ && multiple_choice_.items != nullptr && !multiple_choice_.items->empty();
  }
  bool passed(int64_t every, int64_t step_before, int64_t step_after) const {
    return evaluates_ && every > 0 && step_after / every > step_before / every;
  }
  void add(StageBatches& batches, int64_t limit_tokens, Json& record) {
    const Json figures = batches.evaluate(model_, limit_tokens);
    for (const auto& [name, value] : figures.items()) record[name] = value;
  }

  LingForCausalLM& model_;
  bool evaluates_;
  int64_t every_, tokens_;
  MultipleChoiceEvaluation multiple_choice_;
};

}  // namespace lt
