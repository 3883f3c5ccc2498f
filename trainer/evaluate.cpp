#include "trainer/evaluate.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "data/batch_sampler.h"
#include "tensor/error.h"

namespace lt {

LossSum evaluate(LingForCausalLM& model, const TokenShards& tokens, int64_t T, int64_t batch, int64_t limit_tokens) {
  NoGradGuard no_grad;
  LossSum total;
  auto add_batch = [&](const Tensor& inputs, const Tensor& targets) {
    MoEContext context;
    const LossBreakdown loss = model.loss(inputs, targets, context);
    total.sum += loss.lm.value().item() * static_cast<double>(inputs.numel());
    total.tokens += inputs.numel();
  };
  HeldoutBatches windows(tokens, batch, T, limit_tokens);
  while (std::optional<TokenBatch> b = windows.next()) add_batch(b->inputs, b->targets);
  const int64_t n = limit_tokens > 0 ? std::min(limit_tokens, tokens.num_tokens()) : tokens.num_tokens();
  const int64_t start = windows.num_windows() * T, remaining = n - start;
  if (remaining >= 2) {
    std::vector<int32_t> tail(static_cast<size_t>(remaining));
    tokens.read(start, remaining, tail.data());
    add_batch(Tensor::from_vector<int32_t>({1, remaining - 1}, std::vector<int32_t>(tail.begin(), tail.end() - 1)),
              Tensor::from_vector<int32_t>({1, remaining - 1}, std::vector<int32_t>(tail.begin() + 1, tail.end())));
  }
  return total;
}

SequenceLogprob masked_logprob(LingForCausalLM& model, std::span<const uint32_t> ids, std::span<const uint8_t> mask,
                               const std::string& what) {
  LT_CHECK(ids.size() == mask.size(), what, ": ", ids.size(), " ids but ", mask.size(), " mask entries");
  const auto n = static_cast<int64_t>(ids.size());
  LT_CHECK(n <= model.config().max_position_embeddings + 1, what, ": ", n, " tokens, longer than max_position_embeddings ",
           model.config().max_position_embeddings, " + 1");
  LT_CHECK(n == 0 || mask[0] == 0, what, ": the first token cannot be predicted, its mask must be 0");
  SequenceLogprob result;
  for (uint8_t m : mask) result.tokens += m != 0;
  if (result.tokens == 0) return result;
  std::vector<int32_t> inputs(static_cast<size_t>(n - 1)), targets(static_cast<size_t>(n - 1));
  for (int64_t t = 0; t + 1 < n; ++t) {
    inputs[static_cast<size_t>(t)] = static_cast<int32_t>(ids[static_cast<size_t>(t)]);
    targets[static_cast<size_t>(t)] = mask[static_cast<size_t>(t + 1)] ? static_cast<int32_t>(ids[static_cast<size_t>(t + 1)]) : -100;
  }
  NoGradGuard no_grad;
  MoEContext context;
  const LossBreakdown loss = model.loss(Tensor::from_vector<int32_t>({1, n - 1}, inputs),
                                        Tensor::from_vector<int32_t>({1, n - 1}, targets), context);
  // lm is the mean over the non-ignored targets, which are exactly the marked tokens.
  result.logp = -loss.lm.value().item() * static_cast<double>(result.tokens);
  return result;
}

std::vector<double> packed_sequence_logprobs(LingForCausalLM& model, const std::vector<PackedRow>& rows,
                                             int64_t sequences, int64_t batch) {
  NoGradGuard no_grad;
  std::vector<double> logp(static_cast<size_t>(sequences), 0.0);
  for (size_t first = 0; first < rows.size(); first += static_cast<size_t>(batch)) {
    const size_t count = std::min(rows.size() - first, static_cast<size_t>(batch));
    const TokenBatch b = stack_rows(rows, row_range(first, count));
    MoEContext context;
    const std::vector<double> token_logp =
        model.target_logprobs(b.inputs, b.targets, context, b.doc_start).value().to(DType::F64).to_vector<double>();
    size_t n = 0;
    for (size_t r = first; r < first + count; ++r)
      for (size_t t = 0; t < rows[r].sequence.size(); ++t, ++n)
        if (rows[r].sequence[t] >= 0 && rows[r].counted[t])
          logp[static_cast<size_t>(rows[r].sequence[t])] += token_logp[n];
  }
  return logp;
}

}  // namespace lt
