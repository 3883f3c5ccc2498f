#include "data/multiple_choice.h"

#include <algorithm>

#include "data/jsonl.h"
#include "tensor/derive_seed.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace lt {

namespace {

// What Python's str.strip() and rstrip() remove among ASCII bytes (str.isspace): the harness's
// preprocessing and its moving of a context's trailing whitespace are written with them.
constexpr std::string_view kWhitespace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";

std::string_view strip(std::string_view text) {
  const size_t first = text.find_first_not_of(kWhitespace);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(kWhitespace) - first + 1);
}

// Python's str.replace: non-overlapping occurrences, left to right, in one pass.
std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  size_t begin = 0;
  for (size_t at = text.find(from); at != std::string_view::npos; at = text.find(from, begin)) {
    out.append(text.substr(begin, at - begin)).append(to);
    begin = at + from.size();
  }
  return out.append(text.substr(begin));
}

// re.sub(r"\[.*?\]", "", text): from each '[' to the first ']' after it, unless a newline comes first
// ('.' does not match one), in which case that '[' stays.
std::string drop_bracketed(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') {
      const size_t close = text.find_first_of("]\n", i + 1);
      if (close != std::string_view::npos && text[close] == ']') {
        i = close;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

std::vector<std::string> string_array(const Json& record, const std::string& key, const std::string& where) {
  const Json& value = record.at(key);
  LT_CHECK(value.is_array(), where, ": key '", key, "' must be an array of strings, got ", value.type_name());
  LT_CHECK(!value.empty(), where, ": no choices: key '", key, "' is an empty array");
  std::vector<std::string> strings;
  for (const Json& element : value) {
    LT_CHECK(element.is_string(), where, ": key '", key, "' must be an array of strings, holds ", element.type_name());
    strings.push_back(element.get<std::string>());
  }
  return strings;
}

// An integer, or a string of digits as the Hugging Face copy of HellaSwag writes its labels.
int64_t read_label(const Json& value, const std::string& where) {
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    const bool digits = std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!text.empty() && text.size() <= 9 && digits) return std::stoll(text);
  }
  fail(where, ": key 'label' must be a choice's index (an integer), got ", value.dump());
}

}  // namespace

std::string hellaswag_preprocess(std::string_view text) {
  const std::string titled = replace_all(strip(text), " [title]", ". ");
  return replace_all(drop_bracketed(titled), "  ", " ");
}

std::string capitalize_ascii(std::string_view text) {
  std::string out(text);
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (i == 0 && c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 'a' + 'A');
    if (i > 0 && c >= 'A' && c <= 'Z') out[i] = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

int64_t utf8_characters(std::string_view text) {
  // Every code point has exactly one byte that is not a continuation byte (10xxxxxx).
  return std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

MultipleChoiceItem multiple_choice_item_from_json(const Json& record, const std::string& where) {
  const JsonObject fields(record, where);
  MultipleChoiceItem item;
  item.where = where;
  const bool hellaswag = fields.has("endings");
  LT_CHECK(hellaswag || fields.has("choices"), where,
           ": no choices: an item needs 'choices' (or HellaSwag's 'endings')");
  const std::vector<std::string> choices = string_array(record, hellaswag ? "endings" : "choices", where);
  if (hellaswag) {
    item.delimiter = " ";
    if (fields.has("activity_label") && fields.has("ctx_a") && fields.has("ctx_b"))
      item.context = hellaswag_preprocess(fields.get<std::string>("activity_label") + ": " +
                                          fields.get<std::string>("ctx_a") + " " +
                                          capitalize_ascii(fields.get<std::string>("ctx_b")));
    else
      item.context = hellaswag_preprocess(fields.get<std::string>("ctx"));
    for (const std::string& ending : choices) item.choices.push_back(hellaswag_preprocess(ending));
  } else {
    item.context = fields.get<std::string>("context");
    item.choices = choices;
  }
  for (size_t c = 0; c < item.choices.size(); ++c)
    LT_CHECK(!item.choices[c].empty(), where, ": choice ", c, " is empty");
  LT_CHECK(fields.has("label"), where, ": no label: an item needs 'label', the index of its correct choice");
  item.label = read_label(record.at("label"), where);
  LT_CHECK(item.label >= 0 && item.label < static_cast<int64_t>(item.choices.size()), where, ": label ", item.label,
           " is out of range for ", item.choices.size(), " choices");
  return item;
}

std::vector<MultipleChoiceItem> read_multiple_choice_file(const std::string& path, int64_t limit) {
  LT_CHECK(limit >= 0, "a limit on items must be >= 0, got ", limit);
  std::vector<MultipleChoiceItem> items;
  for_each_jsonl_record(path, [&](const Json& record, const std::string& where) {
    if (limit == 0 || static_cast<int64_t>(items.size()) < limit)
      items.push_back(multiple_choice_item_from_json(record, where));
  });
  return items;
}

Json multiple_choice_item_to_json(const MultipleChoiceItem& item) {
  Json choices = Json::array();
  for (const std::string& choice : item.choices) choices.push_back(item.delimiter + choice);
  return {{"context", item.context}, {"choices", choices}, {"label", item.label}};
}

std::vector<size_t> draw_few_shot_examples(size_t pool_size, int64_t shots, uint64_t seed, size_t item_index,
                                           std::optional<size_t> exclude) {
  LT_CHECK(shots >= 0, "few-shot: the number of examples must be >= 0, got ", shots);
  const size_t available = pool_size - (exclude && *exclude < pool_size ? 1 : 0);
  LT_CHECK(static_cast<size_t>(shots) <= available, "few-shot: ", shots, " examples asked for, but the pool holds ",
           available, exclude ? " other items" : " items");
  Rng rng(derive_seed(seed, item_index));
  std::vector<size_t> picked;
  // Rejection: a handful of examples from a pool of thousands costs a handful of draws, not a shuffle.
  while (picked.size() < static_cast<size_t>(shots)) {
    const size_t index = rng.below(pool_size);
    if (index != exclude && std::find(picked.begin(), picked.end(), index) == picked.end()) picked.push_back(index);
  }
  return picked;
}

std::string few_shot_context(const MultipleChoiceItem& item, const std::vector<const MultipleChoiceItem*>& examples) {
  std::string prompt;
  for (const MultipleChoiceItem* example : examples)
    prompt += example->context + example->delimiter + example->choices[static_cast<size_t>(example->label)] + "\n\n";
  return prompt + item.context;
}

MultipleChoiceSequences multiple_choice_sequences(const MultipleChoiceItem& item, std::string_view context,
                                                  const Tokenizer& tokenizer, int64_t max_tokens) {
  LT_CHECK(max_tokens >= 2, "multiple choice: a sequence needs room for 2 tokens, got ", max_tokens);
  const size_t kept = context.find_last_not_of(kWhitespace);
  const std::string_view bare = kept == std::string_view::npos ? std::string_view() : context.substr(0, kept + 1);
  const std::string_view moved = context.substr(bare.size());
  std::vector<uint32_t> context_ids;
  append_document_tokens(context_ids, bare, tokenizer);
  const size_t context_tokens = context_ids.size() - 1;  // without the eos
  MultipleChoiceSequences out;
  for (size_t c = 0; c < item.choices.size(); ++c) {
    const std::string continuation = std::string(moved) + item.delimiter + item.choices[c];
    const std::vector<uint32_t> whole = tokenizer.encode(std::string(bare) + continuation);
    LT_CHECK(whole.size() > context_tokens, item.where, ": choice ", c, " adds no token to the context");
    const size_t choice_tokens = whole.size() - context_tokens;
    LT_CHECK(static_cast<int64_t>(choice_tokens) < max_tokens, item.where, ": choice ", c, " has ", choice_tokens,
             " tokens; a model of ", max_tokens - 1, " positions scores at most ", max_tokens - 1);
    LabeledSequence sequence;
    sequence.ids = context_ids;
    sequence.ids.insert(sequence.ids.end(), whole.begin() + static_cast<std::ptrdiff_t>(context_tokens), whole.end());
    sequence.loss_mask.assign(context_ids.size(), 0);
    sequence.loss_mask.resize(sequence.ids.size(), 1);
    const auto excess = static_cast<int64_t>(sequence.ids.size()) - max_tokens;
    if (excess > 0) {
      sequence.ids.erase(sequence.ids.begin(), sequence.ids.begin() + excess);
      sequence.loss_mask.erase(sequence.loss_mask.begin(), sequence.loss_mask.begin() + excess);
      out.truncated = true;
    }
    out.choices.push_back(std::move(sequence));
  }
  return out;
}

}  // namespace lt
