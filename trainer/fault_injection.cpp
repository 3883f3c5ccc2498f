#include "trainer/fault_injection.h"

#include <chrono>
#include <cmath>
#include <thread>

#include "autograd/ops.h"

namespace lt {

Objective FaultInjector::wrap(Objective objective) {
  if (injections_.empty()) return objective;
  return [this, objective = std::move(objective)](LingForCausalLM& model, const TokenBatch& batch, MoEContext& context) {
    for (const Injection& injection : injections_)
      if (injection.kind == Injection::Kind::Hang && injection.step == context.step && injection.rank == rank_)
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    LossBreakdown loss = objective(model, batch, context);
    for (const Injection& injection : injections_)
      if (injection.kind != Injection::Kind::Hang && injection.step == context.step &&
          attempts_[injection.step] < injection.count) {
        const double factor = injection.kind == Injection::Kind::Nan ? NAN : injection.factor;
        loss.total = scale(loss.total, factor);
        loss.lm = scale(loss.lm, factor);
      }
    return loss;
  };
}

void FaultInjector::attempt_judged(int64_t step) {
  for (const Injection& injection : injections_)
    if (injection.step == step) {
      ++attempts_[step];
      return;
    }
}

}  // namespace lt
