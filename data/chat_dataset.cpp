#include "data/chat_dataset.h"

#include <algorithm>

#include "data/chat_template.h"
#include "data/jsonl.h"
#include "tensor/error.h"

namespace lt {

ChatDataset load_conversations(const std::string& path, const Tokenizer& tokenizer, int64_t max_tokens) {
  ChatDataset data;
  for_each_jsonl_record(path, [&](const Json& record, const std::string& where) {
    ++data.records;
    RenderedChat chat = render_chat(conversation_from_json(record, where), tokenizer);
    if (static_cast<int64_t>(chat.ids.size()) > max_tokens) {
      ++data.too_long;
      return;
    }
    data.sequences.push_back({std::move(chat.ids), std::move(chat.loss_mask)});
  });
  return data;
}

namespace {

// A response's rendering after the prompt's, with only the response labelled.
LabeledSequence response_sequence(const Json& prompt, const Json& response, const char* field,
                                  const std::string& where, const Tokenizer& tokenizer,
                                  const std::vector<uint32_t>& prompt_ids) {
  const std::vector<ChatMessage> messages =
      conversation_from_json(Json{{"prompt", prompt}, {"completion", response}}, where + " (" + field + ")");
  RenderedChat chat = render_chat(messages, tokenizer);
  // Turn-by-turn rendering makes the prompt's ids a prefix of every continuation's.
  LT_CHECK(chat.ids.size() > prompt_ids.size() && std::equal(prompt_ids.begin(), prompt_ids.end(), chat.ids.begin()),
           where, ": the prompt does not render the same before the ", field, " response");
  std::fill(chat.loss_mask.begin(), chat.loss_mask.begin() + static_cast<std::ptrdiff_t>(prompt_ids.size()), 0);
  return {std::move(chat.ids), std::move(chat.loss_mask)};
}

// Format-recovery DPO: each response's tokens outside the longest common prefix and suffix of the two.
void mark_format_tokens(LabeledSequence& chosen, LabeledSequence& rejected, size_t prompt_length) {
  const size_t c = chosen.ids.size() - prompt_length, r = rejected.ids.size() - prompt_length;
  size_t prefix = 0;
  while (prefix < std::min(c, r) && chosen.ids[prompt_length + prefix] == rejected.ids[prompt_length + prefix]) ++prefix;
  // The responses differ (identical pairs are skipped earlier), and each ends with <|endoftext|>, so the
  // prefix is shorter than both; the suffix leaves each response at least one token.
  size_t suffix = 0;
  while (suffix + prefix + 1 < std::min(c, r) && chosen.ids[chosen.ids.size() - 1 - suffix] == rejected.ids[rejected.ids.size() - 1 - suffix])
    ++suffix;
  for (LabeledSequence* s : {&chosen, &rejected}) {
    s->dpo_mask.assign(s->ids.size(), 0);
    for (size_t i = prompt_length + prefix; i < s->ids.size() - suffix; ++i) s->dpo_mask[i] = s->loss_mask[i];
  }
}

}  // namespace

ChatDataset load_preference_pairs(const std::string& path, const Tokenizer& tokenizer, int64_t max_tokens) {
  ChatDataset data;
  for_each_jsonl_record(path, [&](const Json& record, const std::string& where) {
    ++data.records;
    for (const char* field : {"prompt", "chosen", "rejected"})
      LT_CHECK(record.contains(field), where, ": a preference pair needs 'prompt', 'chosen' and 'rejected'");
    const Json& prompt = record.at("prompt");
    const bool format_only = record.contains("format_only") && record.at("format_only").is_boolean() &&
                             record.at("format_only").get<bool>();
    LT_CHECK(!record.contains("format_only") || record.at("format_only").is_boolean(), where,
             ": 'format_only' must be true or false");
    // The prompt alone, rendered the way it starts each response's rendering.
    std::vector<ChatMessage> prompt_messages;
    if (prompt.is_string()) {
      prompt_messages.push_back({ChatRole::kUser, prompt.get<std::string>()});
    } else {
      Json with_reply = {{"prompt", prompt}, {"completion", "x"}};
      prompt_messages = conversation_from_json(with_reply, where);
      prompt_messages.pop_back();
    }
    const std::vector<uint32_t> prompt_ids = render_chat(prompt_messages, tokenizer).ids;
    LabeledSequence chosen = response_sequence(prompt, record.at("chosen"), "chosen", where, tokenizer, prompt_ids);
    LabeledSequence rejected = response_sequence(prompt, record.at("rejected"), "rejected", where, tokenizer, prompt_ids);
    if (chosen.ids == rejected.ids) {
      ++data.identical;
      return;
    }
    if (static_cast<int64_t>(chosen.ids.size() + rejected.ids.size()) > max_tokens) {
      ++data.too_long;
      return;
    }
    if (format_only) {
      mark_format_tokens(chosen, rejected, prompt_ids.size());
      ++data.format_only;
    }
    data.sequences.push_back(std::move(chosen));
    data.sequences.push_back(std::move(rejected));
  });
  return data;
}

}  // namespace lt
