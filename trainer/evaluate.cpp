#include "trainer/evaluate.h"

#include <optional>

#include "data/batch_sampler.h"

namespace lt {

LossSum evaluate(LingForCausalLM& model, const Tensor& tokens, int64_t T, int64_t batch) {
  NoGradGuard no_grad;
  LossSum total;
  auto add_batch = [&](const Tensor& inputs, const Tensor& targets) {
    MoEContext context;
    const LossBreakdown loss = model.loss(inputs, targets, context);
    total.sum += loss.lm.value().item() * static_cast<double>(inputs.numel());
    total.tokens += inputs.numel();
  };
  HeldoutBatches windows(tokens, batch, T);
  while (std::optional<TokenBatch> b = windows.next()) add_batch(b->inputs, b->targets);
  const int64_t start = windows.num_windows() * T, remaining = tokens.numel() - start;
  if (remaining >= 2) {
    const Tensor tail = tokens.narrow(start, remaining);
    add_batch(tail.narrow(0, remaining - 1).clone().reshape({1, remaining - 1}),
              tail.narrow(1, remaining - 1).clone().reshape({1, remaining - 1}));
  }
  return total;
}

}  // namespace lt
