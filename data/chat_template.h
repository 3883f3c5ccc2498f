// Ling's chat template (docs/architecture.md; spec: Hugging Face's Ling-lite template and LLaMA-Factory's
// `bailing` template with efficient_eos), rendering a conversation into token ids and a loss mask:
//
//   <role>SYSTEM</role>{system}<role>HUMAN</role>{user}<role>ASSISTANT</role>{reply}<|endoftext|>
//   <role>OBSERVATION</role>{tool result}<role>ASSISTANT</role>{reply}<|endoftext|> ...
//
// No separator between turns; <|endoftext|> ends every assistant reply and is trained on, so the model
// learns to stop. The loss mask is 1 on the tokens of each assistant reply and its <|endoftext|>, 0 on
// everything else (the role markers included).
//
// Tokenisation is turn by turn: the markers as special tokens, the contents as plain text (a
// "<|endoftext|>" typed by a user stays text and cannot end a turn or open a role). With a tokenizer
// whose markers are special tokens (lingtrain's, Ling's) this gives the ids of tokenising the whole
// rendered text; with one where "<role>" is ordinary text, BPE could have merged across a marker and a
// content, which turn-by-turn tokenisation never does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "io/json.h"

namespace lt {

enum class ChatRole { kSystem, kUser, kAssistant, kObservation };

struct ChatMessage {
  ChatRole role;
  std::string content;
};

// A conversation from one JSONL record, in TRL's forms: {"messages": [{"role", "content"}, ...]}, or
// {"prompt": ..., "completion": ...} with strings (a user turn and an assistant reply) or message lists.
// Roles: system, user (or human), assistant, observation (or tool). Fails, naming `where` (file:line),
// on a missing or malformed field, an unknown role, content that is not a string, no assistant turn, or
// an empty assistant turn.
std::vector<ChatMessage> conversation_from_json(const Json& record, const std::string& where);

struct RenderedChat {
  std::string text;                // what the template writes, markers spelled out
  std::vector<uint32_t> ids;
  std::vector<uint8_t> loss_mask;  // one per id
};

// add_generation_prompt appends <role>ASSISTANT</role> (for sampling a reply), masked out.
RenderedChat render_chat(const std::vector<ChatMessage>& messages, const Tokenizer& tokenizer,
                         bool add_generation_prompt = false);

}  // namespace lt
