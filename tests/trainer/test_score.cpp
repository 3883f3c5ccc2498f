// masked_logprob (lingtrain score, DPO's reference log-probabilities): through the training loss it must
// equal the log-softmax of the model's logits summed over the marked tokens, an independent path.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/ling.h"
#include "tests/io/temp_dir.h"
#include "tests/model/small_config.h"
#include "trainer/evaluate.h"

namespace lt {
namespace {

TEST(MaskedLogprob, EqualsTheLogSoftmaxOfTheLogitsOverTheMarkedTokens) {
  const LingConfig config = test::small_config();
  LingForCausalLM model(config, 3);
  Rng rng(11);
  const int64_t n = 40;
  std::vector<uint32_t> ids(n);
  std::vector<uint8_t> mask(n, 0);
  for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<uint32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
  for (int64_t t = 10; t < 18; ++t) mask[t] = 1;  // a reply ...
  for (int64_t t = 30; t < n; ++t) mask[t] = 1;   // ... and another, to the end

  const SequenceLogprob scored = masked_logprob(model, ids, mask, "test");
  EXPECT_EQ(scored.tokens, 18);

  // Reference: logits of the whole sequence, log-softmax in f64, summed over the marked next tokens.
  std::vector<int32_t> inputs(ids.begin(), ids.end() - 1);
  MoEContext context;
  NoGradGuard no_grad;
  const std::vector<float> logits =
      model.logits(Tensor::from_vector<int32_t>({1, n - 1}, inputs), context).value().to_vector<float>();
  const int64_t V = config.vocab_size;
  double expected = 0;
  for (int64_t t = 0; t + 1 < n; ++t) {
    if (!mask[t + 1]) continue;
    const float* row = logits.data() + t * V;
    double max = row[0], sum = 0;
    for (int64_t v = 1; v < V; ++v) max = std::max<double>(max, row[v]);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - max);
    expected += row[ids[t + 1]] - max - std::log(sum);
  }
  EXPECT_NEAR(scored.logp, expected, 1e-4 * std::abs(expected));
  EXPECT_LT(scored.logp, 0);

  // Nothing marked: zero; bad masks and overlong sequences are one-line errors naming the sequence.
  const std::vector<uint8_t> none(n, 0);
  EXPECT_EQ(masked_logprob(model, ids, none, "test").tokens, 0);
  std::vector<uint8_t> first = none;
  first[0] = 1;
  test::expect_error([&] { masked_logprob(model, ids, first, "data.jsonl:3"); }, {"data.jsonl:3", "first token"});
  test::expect_error([&] { masked_logprob(model, ids, std::vector<uint8_t>(n - 1, 0), "data.jsonl:4"); },
                     {"data.jsonl:4", "mask entries"});
  const std::vector<uint32_t> long_ids(static_cast<size_t>(config.max_position_embeddings + 2), 1);
  test::expect_error([&] { masked_logprob(model, long_ids, std::vector<uint8_t>(long_ids.size(), 0), "data.jsonl:5"); },
                     {"data.jsonl:5", "longer than max_position_embeddings"});
}

}  // namespace
}  // namespace lt
