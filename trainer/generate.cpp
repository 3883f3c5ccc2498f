#include "trainer/generate.h"

#include <algorithm>
#include <cmath>

#include "data/corpus.h"

namespace lt {

namespace {

// The next id from the scores of the sampled vocabulary.
uint32_t draw(const std::vector<double>& scores, const SamplingSettings& s, Rng& rng) {
  const int64_t V = static_cast<int64_t>(scores.size());
  if (s.temperature <= 0)
    return static_cast<uint32_t>(std::max_element(scores.begin(), scores.end()) - scores.begin());
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  const int64_t keep_k = s.top_k > 0 ? std::min(s.top_k, V) : V;
  std::vector<double> probs;
  const double max_score = scores[order[0]];
  double total = 0;
  for (int64_t i = 0; i < keep_k; ++i) total += std::exp((scores[order[i]] - max_score) / s.temperature);
  double cumulative = 0;
  for (int64_t i = 0; i < keep_k; ++i) {  // nucleus: the smallest prefix whose mass reaches top_p
    const double p = std::exp((scores[order[i]] - max_score) / s.temperature) / total;
    probs.push_back(p);
    cumulative += p;
    if (cumulative >= s.top_p) break;
  }
  double u = rng.uniform() * cumulative;
  size_t pick = 0;
  while (pick + 1 < probs.size() && u >= probs[pick]) u -= probs[pick++];
  return static_cast<uint32_t>(order[pick]);
}

}  // namespace

std::vector<uint32_t> generate(LingForCausalLM& model, const std::vector<uint32_t>& prompt,
                               const SamplingSettings& settings, int64_t sample_vocab) {
  NoGradGuard no_grad;
  const int64_t model_vocab = model.config().vocab_size;
  LT_CHECK(sample_vocab <= model_vocab, "the tokenizer's vocabulary (", sample_vocab, ") exceeds the model's (",
           model_vocab, ")");
  LT_CHECK(settings.top_p > 0 && settings.top_p <= 1, "sampling: top_p must be in (0, 1], got ", settings.top_p);
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + settings.max_new_tokens;
  LT_CHECK(capacity <= model.config().max_position_embeddings, "prompt plus new tokens (", capacity,
           ") exceed the model's max_position_embeddings (", model.config().max_position_embeddings, ")");
  Rng rng(settings.seed);
  std::vector<KVCache> caches = model.make_kv_caches(1, capacity);
  std::vector<uint32_t> out;
  std::vector<int32_t> step_ids(prompt.begin(), prompt.end());
  int64_t position = 0;
  for (int64_t n = 0; n < settings.max_new_tokens; ++n) {
    const int64_t T = static_cast<int64_t>(step_ids.size());
    MoEContext context;
    const Variable logits = model.logits(Tensor::from_vector<int32_t>({1, T}, step_ids), context, position, &caches);
    position += T;
    const std::vector<float> all = logits.value().to_vector<float>();
    const std::vector<double> scores(all.end() - model_vocab, all.end() - model_vocab + sample_vocab);
    const uint32_t next = draw(scores, settings, rng);
    out.push_back(next);
    if (settings.stop_at && next == *settings.stop_at) break;
    step_ids.assign(1, static_cast<int32_t>(next));
  }
  return out;
}

int64_t sample_prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<uint32_t> ids;
  append_document_tokens(ids, prompt, tokenizer);
  return static_cast<int64_t>(ids.size());
}

std::string sample_text(LingForCausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                        const SamplingSettings& settings) {
  std::vector<uint32_t> ids;
  append_document_tokens(ids, prompt, tokenizer);  // eos first, as every training document starts
  return tokenizer.decode(generate(model, ids, settings, tokenizer.vocab_size()));
}

}  // namespace lt
