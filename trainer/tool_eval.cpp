#include "trainer/tool_eval.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "data/chat_template.h"
#include "trainer/generate.h"

namespace lt {

namespace {

double ratio(int64_t part, int64_t whole) { return whole ? static_cast<double>(part) / static_cast<double>(whole) : 0.0; }

// A conversation as the model plays it: the messages so far, the expected path (its calls in order, and
// the value the last observation gave), and the model's next turn.
struct PlayedConversation {
  std::vector<ChatMessage> played;
  std::vector<std::pair<std::string, std::string>> calls;
  std::string answer_value;
  size_t turn = 0;
};

// Scores `reply` as the conversation's next turn and, when it is a call, appends the call and the graph's
// answer; true while the conversation goes on (a call, and a turn left on the expected path).
bool play_reply(PlayedConversation& c, const std::string& reply, const KnowledgeGraph& graph,
                ToolEvalResult& result) {
  const auto call = parse_tool_call(reply);
  if (c.turn < c.calls.size()) {
    result.valid_format += call.has_value();
    result.exact_calls += call.has_value() && *call == c.calls[c.turn];
    result.relation_calls += call.has_value() && call->second == c.calls[c.turn].second;
  }
  if (!call) {
    result.correct_answers += reply.find(c.answer_value) != std::string::npos;
    return false;
  }
  c.played.push_back({ChatRole::kAssistant, reply});
  c.played.push_back({ChatRole::kObservation, tool_result(graph.lookup(call->first, call->second))});
  return ++c.turn <= c.calls.size();
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
                                 const std::vector<std::pair<Json, std::string>>& records, int64_t max_reply_tokens,
                                 int64_t batch) {
  LT_CHECK(batch > 0, "tool evaluation: batch must be > 0, got ", batch);
  ToolEvalResult result;
  std::vector<PlayedConversation> conversations;
  for (const auto& [record, where] : records) {
    const std::vector<ChatMessage> expected = conversation_from_json(record, where);
    const auto first_reply = std::find_if(expected.begin(), expected.end(),
                                          [](const ChatMessage& m) { return m.role == ChatRole::kAssistant; });
    PlayedConversation c;
    c.played.assign(expected.begin(), first_reply);
    for (auto m = first_reply; m != expected.end(); ++m) {
      if (m->role == ChatRole::kAssistant) {
        if (const auto call = parse_tool_call(m->content)) c.calls.push_back(*call);
      } else if (m->role == ChatRole::kObservation) {
        if (const auto value = parse_tool_result(m->content)) c.answer_value = *value;
      }
    }
    if (c.calls.empty() || c.answer_value.empty()) {
      ++result.skipped;
      continue;
    }
    ++result.conversations;
    result.expected_calls += static_cast<int64_t>(c.calls.size());
    conversations.push_back(std::move(c));
  }

  // The model plays the conversations, as many replies each as its expected path has, no more. Each round
  // gives every conversation still playing its next reply, `batch` of them decoded together (greedy, so a
  // reply is the one it would get alone); a conversation whose prompt fills the model's positions ends.
  SamplingSettings greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = max_reply_tokens;
  greedy.stop_at = tokenizer.eos_id();
  greedy.end_at_context = true;
  std::vector<size_t> playing(conversations.size());
  for (size_t i = 0; i < playing.size(); ++i) playing[i] = i;
  while (!playing.empty()) {
    std::vector<size_t> still_playing;
    for (size_t begin = 0; begin < playing.size(); begin += static_cast<size_t>(batch)) {
      std::vector<size_t> replying;
      std::vector<std::vector<uint32_t>> prompts;
      for (size_t i = begin; i < std::min(playing.size(), begin + static_cast<size_t>(batch)); ++i) {
        RenderedChat prompt = render_chat(conversations[playing[i]].played, tokenizer, /*add_generation_prompt=*/true);
        if (static_cast<int64_t>(prompt.ids.size()) >= model.config().max_position_embeddings) continue;
        replying.push_back(playing[i]);
        prompts.push_back(std::move(prompt.ids));
      }
      if (prompts.empty()) continue;
      const std::vector<std::vector<uint32_t>> replies = generate_batch(model, prompts, greedy, tokenizer.vocab_size());
      for (size_t r = 0; r < replying.size(); ++r) {
        std::vector<uint32_t> ids = replies[r];
        if (!ids.empty() && ids.back() == tokenizer.eos_id()) ids.pop_back();
        if (play_reply(conversations[replying[r]], tokenizer.decode(ids), graph, result))
          still_playing.push_back(replying[r]);
      }
    }
    playing = std::move(still_playing);
  }
  return result;
}

}  // namespace lt
