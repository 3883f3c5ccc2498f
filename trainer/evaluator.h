// The held-out figures of a run, each stage's own (the next-token loss; SFT's loss on the assistant
// tokens; DPO's eval_ metrics, trainer/stage_batches.h): at every --eval-every point on about the first
// --eval-tokens held-out tokens, and over all of the held-out data at the end. Rank 0 evaluates
// (under expert parallelism with the other ranks of its group, each forward being collective over them).
#pragma once
#include <cstdint>

#include "io/json.h"
#include "trainer/stage_batches.h"

namespace lt {

class Evaluator {
 public:
  Evaluator(LingForCausalLM& model, bool evaluates, int64_t every, int64_t tokens)
      : model_(model), evaluates_(evaluates), every_(every), tokens_(tokens) {}

  // Whether an --eval-every point lies in (step_before, step_after]: one step, or an A-EDiT round
  // that passed one (its figures are then taken at the round's end).
  bool due(int64_t step_before, int64_t step_after) const {
    return evaluates_ && every_ > 0 && step_after / every_ > step_before / every_;
  }
  // Whether periodic figures are taken at all (a post-training stage's "before" figures go with them).
  bool periodic() const { return evaluates_ && every_ > 0; }
  // The periodic figures into `record` (none without held-out data).
  void add_periodic(StageBatches& batches, Json& record) { add(batches, tokens_, record); }
  // The figures over all of the held-out data.
  Json all(StageBatches& batches) {
    Json figures = Json::object();
    add(batches, 0, figures);
    return figures;
  }

 private:
  void add(StageBatches& batches, int64_t limit_tokens, Json& record) {
    const Json figures = batches.evaluate(model_, limit_tokens);
    for (const auto& [name, value] : figures.items()) record[name] = value;
  }

  LingForCausalLM& model_;
  bool evaluates_;
  int64_t every_, tokens_;
};

}  // namespace lt
