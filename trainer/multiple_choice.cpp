#include "trainer/multiple_choice.h"

#include <algorithm>
#include <optional>

#include "data/packing.h"
#include "tensor/error.h"
#include "trainer/evaluate.h"

namespace lt {

namespace {

// Rows are this long (or the model's positions, where fewer) unless one sequence needs more: a row packs
// several choices, and attention's cost per token grows with the row's length.
constexpr int64_t kRowPositions = 1024;

// The index of the largest value, the first of equal ones (numpy's argmax).
int64_t argmax(const std::vector<double>& values) {
  return std::max_element(values.begin(), values.end()) - values.begin();
}

}  // namespace

Json MultipleChoiceResult::summary() const {
  return {{"acc", acc}, {"acc_norm", acc_norm}, {"n", n},
          {"truncated", truncated}, {"shots", shots}, {"chance", chance}};
}

MultipleChoiceResult evaluate_multiple_choice(LingForCausalLM& model, const Tokenizer& tokenizer,
                                              const std::vector<MultipleChoiceItem>& items,
                                              const MultipleChoiceSettings& settings) {
  LT_CHECK(settings.batch > 0, "multiple choice: rows per forward must be > 0, got ", settings.batch);
  const int64_t positions = model.config().max_position_embeddings;
  const int64_t row_positions = std::min(positions, kRowPositions);
  const std::vector<MultipleChoiceItem>& pool = settings.fewshot_pool ? *settings.fewshot_pool : items;
  MultipleChoiceResult result;
  result.n = static_cast<int64_t>(items.size());
  result.shots = settings.shots;
  result.items.resize(items.size());
  int64_t correct = 0, correct_norm = 0, done = 0;
  double chance = 0;

  // Items are scored a chunk at a time, a chunk being about `batch` rows of tokens: the memory stays that
  // of one chunk however many items there are, and progress is reported after each.
  std::vector<LabeledSequence> chunk;
  std::vector<size_t> chunk_items;
  int64_t chunk_tokens = 0, longest = 0;
  auto score_chunk = [&] {
    const std::vector<PackedRow> rows = pack_sequences(chunk, std::max(row_positions, longest - 1), tokenizer.pad_id());
    const std::vector<double> logp =
        packed_sequence_logprobs(model, rows, static_cast<int64_t>(chunk.size()), settings.batch);
    auto next = logp.begin();
    for (size_t i : chunk_items) {
      const MultipleChoiceItem& item = items[i];
      MultipleChoiceScore& score = result.items[i];
      score.logprobs.assign(next, next + static_cast<std::ptrdiff_t>(item.choices.size()));
      next += static_cast<std::ptrdiff_t>(item.choices.size());
      std::vector<double> per_character(item.choices.size());
      for (size_t c = 0; c < item.choices.size(); ++c)
        per_character[c] = score.logprobs[c] / static_cast<double>(utf8_characters(item.choices[c]));
      score.predicted = argmax(score.logprobs);
      score.predicted_norm = argmax(per_character);
      correct += score.predicted == item.label;
      correct_norm += score.predicted_norm == item.label;
      chance += 1.0 / static_cast<double>(item.choices.size());
    }
    done += static_cast<int64_t>(chunk_items.size());
    if (settings.on_progress) settings.on_progress(done, correct);
    chunk.clear();
    chunk_items.clear();
    chunk_tokens = longest = 0;
  };

  for (size_t i = 0; i < items.size(); ++i) {
    std::vector<const MultipleChoiceItem*> examples;
    if (settings.shots > 0)
      for (size_t e : draw_few_shot_examples(pool.size(), settings.shots, settings.seed, i,
                                             settings.fewshot_pool ? std::nullopt : std::optional<size_t>(i)))
        examples.push_back(&pool[e]);
    MultipleChoiceSequences sequences =
        multiple_choice_sequences(items[i], few_shot_context(items[i], examples), tokenizer, positions + 1);
    result.items[i].truncated = sequences.truncated;
    result.truncated += sequences.truncated;
    for (LabeledSequence& sequence : sequences.choices) {
      chunk_tokens += static_cast<int64_t>(sequence.ids.size());
      longest = std::max(longest, static_cast<int64_t>(sequence.ids.size()));
      chunk.push_back(std::move(sequence));
    }
    chunk_items.push_back(i);
    if (chunk_tokens >= settings.batch * row_positions) score_chunk();
  }
  if (!chunk_items.empty()) score_chunk();
  if (result.n > 0) {
    const auto n = static_cast<double>(result.n);
    result.acc = static_cast<double>(correct) / n;
    result.acc_norm = static_cast<double>(correct_norm) / n;
    result.chance = chance / n;
  }
  return result;
}

}  // namespace lt
