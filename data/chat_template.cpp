#include "data/chat_template.h"

#include <algorithm>
#include <cctype>

#include "tensor/error.h"

namespace lt {

namespace {

ChatRole parse_role(std::string name, const std::string& where) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "system") return ChatRole::kSystem;
  if (name == "user" || name == "human") return ChatRole::kUser;
  if (name == "assistant") return ChatRole::kAssistant;
  if (name == "observation" || name == "tool") return ChatRole::kObservation;
  fail(where, ": unknown role '", name, "' (system, user, assistant, observation)");
}

const char* role_marker(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem: return "<role>SYSTEM</role>";
    case ChatRole::kUser: return "<role>HUMAN</role>";
    case ChatRole::kAssistant: return "<role>ASSISTANT</role>";
    case ChatRole::kObservation: return "<role>OBSERVATION</role>";
  }
  return "";
}

void append_messages(const Json& list, const std::string& where, const std::string& field,
                     std::vector<ChatMessage>& out) {
  LT_CHECK(list.is_array(), where, ": '", field, "' must be a list of messages, got ", list.type_name());
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + ": " + field + "[" + std::to_string(i) + "]";
    const Json& message = list[i];
    LT_CHECK(message.is_object() && message.contains("role") && message.contains("content"), at,
             ": a message needs 'role' and 'content'");
    LT_CHECK(message.at("role").is_string(), at, ": 'role' must be a string");
    LT_CHECK(message.at("content").is_string(), at, ": 'content' must be a string, got ",
             message.at("content").type_name());
    out.push_back({parse_role(message.at("role").get<std::string>(), at), message.at("content").get<std::string>()});
  }
}

}  // namespace

std::vector<ChatMessage> conversation_from_json(const Json& record, const std::string& where) {
  std::vector<ChatMessage> messages;
  if (record.contains("messages")) {
    append_messages(record.at("messages"), where, "messages", messages);
  } else {
    LT_CHECK(record.contains("prompt") && record.contains("completion"), where,
             ": a record needs 'messages', or 'prompt' and 'completion'");
    for (const char* field : {"prompt", "completion"}) {
      const Json& part = record.at(field);
      if (part.is_string()) {
        messages.push_back({field[0] == 'p' ? ChatRole::kUser : ChatRole::kAssistant, part.get<std::string>()});
      } else {
        append_messages(part, where, field, messages);
      }
    }
  }
  LT_CHECK(std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) { return m.role == ChatRole::kAssistant; }),
           where, ": no assistant turn (nothing to learn)");
  for (const ChatMessage& message : messages)
    LT_CHECK(message.role != ChatRole::kAssistant || !message.content.empty(), where, ": an empty assistant turn");
  return messages;
}

RenderedChat render_chat(const std::vector<ChatMessage>& messages, const Tokenizer& tokenizer,
                         bool add_generation_prompt) {
  RenderedChat out;
  auto append = [&](const std::vector<uint32_t>& ids, const std::string& text, bool trained) {
    out.text += text;
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.loss_mask.insert(out.loss_mask.end(), ids.size(), trained ? 1 : 0);
  };
  const std::string eos = tokenizer.decode(std::vector<uint32_t>{tokenizer.eos_id()});
  for (const ChatMessage& message : messages) {
    const std::string marker = role_marker(message.role);
    append(tokenizer.encode_with_special_tokens(marker), marker, false);
    const bool reply = message.role == ChatRole::kAssistant;
    append(tokenizer.encode(message.content), message.content, reply);
    if (reply) append({tokenizer.eos_id()}, eos, true);
  }
  if (add_generation_prompt) {
    const std::string marker = role_marker(ChatRole::kAssistant);
    append(tokenizer.encode_with_special_tokens(marker), marker, false);
  }
  return out;
}

}  // namespace lt
