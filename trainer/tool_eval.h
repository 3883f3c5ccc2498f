// Tool-use evaluation (`lingtrain eval-tools`): the model plays each held-out tool conversation itself.
// From the system prompt and the question it generates a reply (greedy, KV cache, until <|endoftext|>);
// a reply that is a tool call is run against the knowledge graph and its result appended as the
// observation, and the model goes on, until it answers or runs out of turns. Per conversation:
//   tool_call_exact_match  each expected call made exactly (name and arguments; the JSON may be spaced
//                          or ordered differently), over all expected calls
//   tool_call_relation_match  each expected call made with the right relation, whatever the entity (the
//                          part of a call that needs no copying of an unseen name)
//   format_validity        each reply where a call was expected parses as a call
//   final_answer_accuracy  the final reply states the expected answer (the last value the graph gave on
//                          the expected path), over conversations
// Records without the tool (plain instructions) are skipped and counted.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "data/tool_data.h"
#include "io/json.h"
#include "model/ling.h"

namespace lt {

struct ToolEvalResult {
  int64_t conversations = 0, skipped = 0;
  int64_t expected_calls = 0, exact_calls = 0, relation_calls = 0, valid_format = 0;
  int64_t correct_answers = 0;
  Json to_json() const;
};

// records: TRL {"messages": [...]} as tool-data writes them; `where` of each names it in errors. Up to
// `batch` conversations' next replies are decoded together (generate_batch); the figures do not depend on it.
ToolEvalResult evaluate_tool_use(LingForCausalLM& model, const Tokenizer& tokenizer, const KnowledgeGraph& graph,
                                 const std::vector<std::pair<Json, std::string>>& records, int64_t max_reply_tokens,
                                 int64_t batch);

}  // namespace lt
