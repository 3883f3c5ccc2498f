#include "trainer/tool_eval.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "data/chat_template.h"
#include "trainer/generate.h"

namespace lt {

namespace {

double ratio(int64_t part, int64_t whole) { return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

// The greedy reply to `played` (its end token dropped), or nullopt when no position is left for one.
std::optional<std::string> reply_to(LingForCausalLM& model, const Tokenizer& tokenizer,
                                    const std::vector<ChatMessage>& played, int64_t max_reply_tokens) {
  const RenderedChat prompt = render_chat(played, tokenizer, /*add_generation_prompt=*/true);
  const int64_t room = model.config().max_position_embeddings - static_cast<int64_t>(prompt.ids.size());
  if (room <= 0) return std::nullopt;
  SamplingSettings greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = std::min(max_reply_tokens, room);
  greedy.stop_at = tokenizer.eos_id();
  std::vector<uint32_t> ids = generate(model, prompt.ids, greedy, tokenizer.vocab_size());
  if (!ids.empty() && ids.back() == tokenizer.eos_id()) ids.pop_back();
  return tokenizer.decode(ids);
}

}  // namespace

Json ToolEvalResult::to_json() const {
  return {{"conversations", conversations},
          {"skipped_without_tool", skipped},
          {"expected_calls", expected_calls},
          {"tool_call_exact_match", ratio(exact_calls, expected_calls)},
          {"tool_call_relation_match", ratio(relation_calls, expected_calls)},
          {"format_validity", ratio(valid_format, expected_calls)},
          {"final_answer_accuracy", ratio(correct_answers, conversations)}};
}

ToolEvalResult evaluate_tool_use(LingForCausalLM& model, const Tokenizer& tokenizer, const KnowledgeGraph& graph,
                                 const std::vector<std::pair<Json, std::string>>& records, int64_t max_reply_tokens) {
  ToolEvalResult result;
  for (const auto& [record, where] : records) {
    const std::vector<ChatMessage> expected = conversation_from_json(record, where);
    const auto first_reply = std::find_if(expected.begin(), expected.end(),
                                          [](const ChatMessage& m) { return m.role == ChatRole::kAssistant; });
    // The expected path: its calls in order, and the value the last observation gave.
    std::vector<std::pair<std::string, std::string>> calls;
    std::string answer_value;
    for (auto m = first_reply; m != expected.end(); ++m) {
      if (m->role == ChatRole::kAssistant) {
        if (const auto call = parse_tool_call(m->content)) calls.push_back(*call);
      } else if (m->role == ChatRole::kObservation) {
        if (const auto value = parse_tool_result(m->content)) answer_value = *value;
      }
    }
    if (calls.empty() || answer_value.empty()) {
      ++result.skipped;
      continue;
    }
    ++result.conversations;
    result.expected_calls += static_cast<int64_t>(calls.size());

    // The model plays the conversation: as many replies as the expected path has, no more.
    std::vector<ChatMessage> played(expected.begin(), first_reply);
    for (size_t turn = 0; turn <= calls.size(); ++turn) {
      const std::optional<std::string> reply = reply_to(model, tokenizer, played, max_reply_tokens);
      if (!reply) break;
      const auto call = parse_tool_call(*reply);
      if (turn < calls.size()) {
        result.valid_format += call.has_value();
        result.exact_calls += call.has_value() && *call == calls[turn];
        result.relation_calls += call.has_value() && call->second == calls[turn].second;
      }
      if (!call) {
        result.correct_answers += reply->find(answer_value) != std::string::npos;
        break;
      }
      played.push_back({ChatRole::kAssistant, *reply});
      played.push_back({ChatRole::kObservation, tool_result(graph.lookup(call->first, call->second))});
    }
  }
  return result;
}

}  // namespace lt
