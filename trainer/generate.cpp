#include "trainer/generate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "data/corpus.h"
#include "tensor/derive_seed.h"
#include "tensor/kernels.h"

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

// Views of rows first .. first + count - 1 of every layer's cache, emptied: a prefill through them fills
// those rows in place.
std::vector<KVCache> empty_cache_rows(const std::vector<KVCache>& caches, int64_t first, int64_t count) {
  std::vector<KVCache> rows;
  for (const KVCache& c : caches)
    rows.push_back({c.k_BTHD.narrow(first, count), c.v_BTHD.narrow(first, count),
                    std::vector<int64_t>(static_cast<size_t>(count), 0)});
  return rows;
}

// The prompts to prefill (their indices), longest first, in groups whose padded tokens are at most 5/4
// of their own (the padding's compute is wasted; a group's forward has a fixed cost of its own): [first,
// end) of the order is one group.
std::vector<std::pair<size_t, size_t>> prefill_groups(const std::vector<int64_t>& order,
                                                      const std::vector<std::vector<uint32_t>>& prompts) {
  const auto length = [&](size_t i) { return static_cast<int64_t>(prompts[order[i]].size()); };
  std::vector<std::pair<size_t, size_t>> groups;
  for (size_t first = 0, end = 0; first < order.size(); first = end) {
    int64_t real = 0;
    for (end = first; end < order.size(); ++end) {
      if (4 * static_cast<int64_t>(end - first + 1) * length(first) > 5 * (real + length(end))) break;
      real += length(end);
    }
    groups.emplace_back(first, end);
  }
  return groups;
}

// Keeps the cache rows `kept` (ascending) as rows 0 .. kept.size() - 1, in that order, and drops the rest:
// the rows of finished sequences leave the batch, so later steps spend no compute on them. Only the filled
// positions of a moved row are copied.
void keep_cache_rows(std::vector<KVCache>& caches, const std::vector<int64_t>& kept) {
  const int64_t n = static_cast<int64_t>(kept.size());
  for (KVCache& c : caches) {
    const Shape row_shape{c.k_BTHD.dim(1), c.k_BTHD.dim(2), c.k_BTHD.dim(3)};
    for (int64_t i = 0; i < n; ++i) {
      if (kept[i] == i) continue;
      const int64_t length = c.length_B[kept[i]];
      for (Tensor* t : {&c.k_BTHD, &c.v_BTHD})
        t->narrow(i, 1).reshape(row_shape).narrow(0, length).copy_from(
            t->narrow(kept[i], 1).reshape(row_shape).narrow(0, length));
      c.length_B[i] = length;
    }
    c.k_BTHD = c.k_BTHD.narrow(0, n);
    c.v_BTHD = c.v_BTHD.narrow(0, n);
    c.length_B.resize(static_cast<size_t>(n));
  }
}

}  // namespace

uint64_t row_sampling_seed(uint64_t seed, int64_t row) {
  return row == 0 ? seed : derive_seed(seed, static_cast<uint64_t>(row));
}

std::vector<std::vector<uint32_t>> generate_batch(LingForCausalLM& model,
                                                  const std::vector<std::vector<uint32_t>>& prompts,
                                                  const SamplingSettings& settings, int64_t sample_vocab) {
  NoGradGuard no_grad;
  const int64_t model_vocab = model.config().vocab_size, positions = model.config().max_position_embeddings;
  LT_CHECK(sample_vocab <= model_vocab, "the tokenizer's vocabulary (", sample_vocab, ") exceeds the model's (",
           model_vocab, ")");
  LT_CHECK(settings.top_p > 0 && settings.top_p <= 1, "sampling: top_p must be in (0, 1], got ", settings.top_p);
  const int64_t rows = static_cast<int64_t>(prompts.size());
  std::vector<int64_t> limit_R(static_cast<size_t>(rows));
  std::vector<Rng> rng_R;
  int64_t capacity = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t prompt_length = static_cast<int64_t>(prompts[r].size());
    LT_CHECK(prompt_length > 0, "generation: prompt ", r, " is empty");
    limit_R[r] = settings.max_new_tokens;
    if (settings.end_at_context)
      limit_R[r] = std::max<int64_t>(0, std::min(limit_R[r], positions - prompt_length));
    LT_CHECK(prompt_length + limit_R[r] <= positions, "prompt plus new tokens (", prompt_length + limit_R[r],
             ") exceed the model's max_position_embeddings (", positions, ")");
    capacity = std::max(capacity, prompt_length + limit_R[r]);
    rng_R.emplace_back(row_sampling_seed(settings.seed, r));
  }
  std::vector<std::vector<uint32_t>> out(static_cast<size_t>(rows));
  // Draws row r's next id from the logits of its last position (at `offset`); true while the row goes on.
  auto extend = [&](int64_t r, const std::vector<float>& logits, size_t offset) {
    const std::vector<double> scores(logits.begin() + offset, logits.begin() + offset + sample_vocab);
    const uint32_t next = draw(scores, settings, rng_R[r]);
    out[r].push_back(next);
    return !(settings.stop_at && next == *settings.stop_at) && static_cast<int64_t>(out[r].size()) < limit_R[r];
  };
  std::vector<KVCache> caches = model.make_kv_caches(rows, capacity);
  // The weights stay as they are for the whole generation: the head is made once, and on the CPU the
  // GEMMs pack each weight once, not at every step.
  const Tensor head_VH = model.decoding_head();
  std::vector<Tensor> constants{head_VH};
  for (const Parameter& p : model.parameters()) constants.push_back(p.value->value());
  const kernels::ReusedMatmulOperands packed_once(std::move(constants));
  // Prefill: prompts of similar lengths together, a group one [G, T] forward through its cache rows, the
  // shorter prompts padded after their ids with their last id (causal attention: no real position sees a
  // padded one; the padded keys lie past the row's cached length, where decoding overwrites them).
  std::vector<int64_t> order;
  for (int64_t r = 0; r < rows; ++r)
    if (limit_R[r] > 0) order.push_back(r);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return prompts[a].size() > prompts[b].size(); });
  std::vector<int64_t> slot_row, kept;  // the prompt each cache row holds; the cache rows that go on
  for (const auto& [first, end] : prefill_groups(order, prompts)) {
    const int64_t G = static_cast<int64_t>(end - first), T = static_cast<int64_t>(prompts[order[first]].size());
    const int64_t slot = static_cast<int64_t>(slot_row.size());
    std::vector<int32_t> ids;
    std::vector<int64_t> lengths_G;
    for (size_t i = first; i < end; ++i) {
      const std::vector<uint32_t>& prompt = prompts[order[i]];
      ids.insert(ids.end(), prompt.begin(), prompt.end());
      ids.insert(ids.end(), static_cast<size_t>(T) - prompt.size(), static_cast<int32_t>(prompt.back()));
      lengths_G.push_back(static_cast<int64_t>(prompt.size()));
    }
    std::vector<KVCache> group_caches = empty_cache_rows(caches, slot, G);
    MoEContext context;
    const std::vector<float> logits =
        model.next_token_logits(Tensor::from_vector<int32_t>({G, T}, ids), lengths_G, context, group_caches, head_VH)
            .value()
            .to_vector<float>();
    for (int64_t g = 0; g < G; ++g) {
      for (KVCache& c : caches) c.length_B[slot + g] = lengths_G[g];
      slot_row.push_back(order[first + g]);
      if (extend(order[first + g], logits, static_cast<size_t>(g * model_vocab))) kept.push_back(slot + g);
    }
  }
  // The rows still running, in the order of the cache rows that hold them.
  std::vector<int64_t> running;
  for (const int64_t slot : kept) running.push_back(slot_row[slot]);
  keep_cache_rows(caches, kept);
  // Decode: one [n, 1] forward per step for the n rows still running, each at its own position.
  while (!running.empty()) {
    const int64_t n = static_cast<int64_t>(running.size());
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(out[running[i]].back());
    MoEContext context;
    const std::vector<float> logits =
        model
            .next_token_logits(Tensor::from_vector<int32_t>({n, 1}, ids),
                               std::vector<int64_t>(static_cast<size_t>(n), 1), context, caches, head_VH)
            .value()
            .to_vector<float>();
    std::vector<int64_t> still_running;
    kept.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (!extend(running[i], logits, static_cast<size_t>(i * model_vocab))) continue;
      kept.push_back(i);
      still_running.push_back(running[i]);
    }
    if (static_cast<int64_t>(kept.size()) < n) keep_cache_rows(caches, kept);
    running = std::move(still_running);
  }
  return out;
}

std::vector<uint32_t> generate(LingForCausalLM& model, const std::vector<uint32_t>& prompt,
                               const SamplingSettings& settings, int64_t sample_vocab) {
  return generate_batch(model, {prompt}, settings, sample_vocab)[0];
}

int64_t sample_prompt_tokens(const Tokenizer& tokenizer, const std::string& prompt) {
  std::vector<uint32_t> ids;
  append_document_tokens(ids, prompt, tokenizer);
  return static_cast<int64_t>(ids.size());
}

std::vector<std::string> sample_texts(LingForCausalLM& model, const Tokenizer& tokenizer, const std::string& prompt,
                                      const SamplingSettings& settings, int64_t count) {
  std::vector<uint32_t> ids;
  append_document_tokens(ids, prompt, tokenizer);  // eos first, as every training document starts
  std::vector<std::string> texts;
  for (const std::vector<uint32_t>& continuation :
       generate_batch(model, std::vector<std::vector<uint32_t>>(static_cast<size_t>(count), ids), settings,
                      tokenizer.vocab_size()))
    texts.push_back(tokenizer.decode(continuation));
  return texts;
}

}  // namespace lt
