// Multiple-choice items (HellaSwag-style evaluation) and the token sequences that score them
// (trainer/multiple_choice.h scores them with a model). JSONL, one item per line, in one of two forms:
//
//   plain      {"context": "...", "choices": ["...", ...], "label": i}. A choice is the exact text that
//              follows the context: nothing is put between them (a task that wants a space puts it in its
//              choices).
//   HellaSwag  {"ctx": "...", "endings": [...], "label": i} as in the original files that llm.c reads (the
//              label may also be a string, "2", as in the Hugging Face copy). Done as lm-evaluation-harness
//              does: where "activity_label", "ctx_a" and "ctx_b" are present the context is
//              preprocess(activity_label + ": " + ctx_a + " " + capitalize(ctx_b)), otherwise
//              preprocess(ctx); each ending is preprocess(ending), and follows its context after a space
//              (the harness's target_delimiter). preprocess and capitalize: hellaswag_preprocess below.
//
// Other keys are ignored. A line with no label, a label out of range, no choices, an empty choice or a
// value of the wrong type fails with the file and the line.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/packing.h"
#include "data/tokenizer.h"
#include "io/json.h"

namespace lt {

struct MultipleChoiceItem {
  std::string context;
  std::vector<std::string> choices;
  int64_t label = 0;
  std::string delimiter;  // between the context and a choice: "" (plain) or " " (HellaSwag)
  std::string where;      // "file:line", for errors about the item
};

MultipleChoiceItem multiple_choice_item_from_json(const Json& record, const std::string& where);
// The items of a file in order; the first `limit` of them (0: all).
std::vector<MultipleChoiceItem> read_multiple_choice_file(const std::string& path, int64_t limit = 0);
// The plain form (context, choices, label); the delimiter, if any, goes into the choices.
Json multiple_choice_item_to_json(const MultipleChoiceItem& item);

// The harness's HellaSwag text clean-up: strip surrounding whitespace, " [title]" -> ". ", drop the
// shortest "[...]" spans (WikiHow artifacts; not across a newline), then one pass of "  " -> " ".
std::string hellaswag_preprocess(std::string_view text);
// Python's str.capitalize on ASCII letters: the first upper case, the rest lower case (other bytes kept).
std::string capitalize_ascii(std::string_view text);

// The characters (Unicode code points) of UTF-8 text: the length acc_norm divides by, as the harness's
// len(choice) counts them (the same as bytes for ASCII text).
int64_t utf8_characters(std::string_view text);

// Few-shot prompts, as the harness builds them: each example's context, delimiter and correct choice, the
// examples and then the item's context joined by "\n\n" (its fewshot_delimiter). The examples of item
// `item_index` are `shots` distinct indices into a pool of `pool_size` items drawn from (seed, item_index),
// never `exclude` (the item itself when the pool is the items' own file); fails when the pool is too small.
std::vector<size_t> draw_few_shot_examples(size_t pool_size, int64_t shots, uint64_t seed, size_t item_index,
                                           std::optional<size_t> exclude);
std::string few_shot_context(const MultipleChoiceItem& item, const std::vector<const MultipleChoiceItem*>& examples);

// One sequence per choice: eos (the document start, as append_document_tokens begins every training
// document), the context's tokens, then the choice's, only the choice's labelled. The choice is
// tokenized as a continuation, as the harness does: trailing whitespace of the context moves to the front
// of the continuation (delimiter + choice), and the continuation's tokens are those that encoding context
// + continuation adds after the context's own tokens. A sequence longer than max_tokens keeps its last
// max_tokens (the whole choice and the end of the context: the harness truncates from the left too); fails
// when a choice alone leaves no token before it.
struct MultipleChoiceSequences {
  std::vector<LabeledSequence> choices;
  bool truncated = false;  // some choice's sequence lost the start of its context
};
MultipleChoiceSequences multiple_choice_sequences(const MultipleChoiceItem& item, std::string_view context,
                                                  const Tokenizer& tokenizer, int64_t max_tokens);

}  // namespace lt
