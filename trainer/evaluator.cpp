#include "trainer/evaluator.h"

#include "trainer/multiple_choice.h"

namespace lt {

void Evaluator::add_multiple_choice(Json& record) {
  if (!scores_multiple_choice()) return;
  const MultipleChoiceResult result = evaluate_multiple_choice(model_, *multiple_choice_.tokenizer,
                                                               *multiple_choice_.items);
  record["mc_acc"] = result.acc;
  record["mc_acc_norm"] = result.acc_norm;
  record["mc_chance"] = result.chance;
  record["mc_items"] = result.n;
  record["mc_truncated"] = result.truncated;
}

}  // namespace lt
