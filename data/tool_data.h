// The embedded post-training data (`lingtrain tool-data`), generated like the pre-training corpus: a
// small knowledge graph, and from it tool-use conversations in Ling's style (the report's tool data is
// synthesised from a knowledge graph), plain instructions, and preference pairs.
//
// The graph: countries, cities (located_in a country; each country has a capital), companies
// (headquartered_in a city, founded_in a year) and people (born_in a city, birth_year, works_for a
// company), all with made-up names, so no fact can come from pre-training: the model has to call the tool.
//
// The tool: lookup(entity, relation) -> {"result": value}. The assistant calls it by replying with
// exactly tool_call(entity, relation), e.g. {"name": "lookup", "arguments": {"entity": "Mirela Vantos",
// "relation": "born_in"}}; the result comes back as an observation turn ({"result": "Valdris"}), and the
// assistant answers in one sentence. Two-hop questions ("In which country was X born?") need two calls, the second on the first's
// result.
//
// Splits: 20% of the people and companies are held out: validation questions are about them only, so a
// held-out score measures the skill (call the tool with the entity named in the question), not memory.
//
// Preference pairs: the prompt is a conversation up to one assistant turn; chosen is the correct turn,
// rejected one of: a call with the wrong relation, a call on the wrong entity, a wrong final answer, or
// a malformed call (format only: same content, broken JSON; marked "format_only" for format-recovery DPO).
//
// Copy instructions ("Repeat exactly: Vebrailar Thoumix" -> "Vebrailar Thoumix", names made up afresh
// for each): a call about an unseen entity needs its name copied from the question, and a small model
// pre-trained on the embedded corpus cannot copy text it has never seen. Fine-tuned on 1,000 steps of
// these first, the tiny model learns to (abruptly, around step 250); SFT on the tool conversations after
// that gets 98% held-out exact calls, against 0% without them and 0.5% with them mixed into the tool
// SFT (docs/post_training.md).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/json.h"

namespace lt {

struct KnowledgeGraph {
  struct Entity {
    std::string name;
    std::string type;  // person, company, city, country
    bool held_out = false;
  };
  std::vector<Entity> entities;
  std::map<std::pair<std::string, std::string>, std::string> facts;  // (entity, relation) -> value

  std::optional<std::string> lookup(const std::string& entity, const std::string& relation) const;
  Json to_json() const;
  // What to_json wrote (knowledge_graph.json); `source` names it in errors.
  static KnowledgeGraph from_json(const Json& json, const std::string& source);
};

KnowledgeGraph build_knowledge_graph(uint64_t seed);

// The exact text of a call, and its parse (nullopt for anything that is not exactly a call's JSON with a
// string entity and relation).
std::string tool_call(const std::string& entity, const std::string& relation);
std::optional<std::pair<std::string, std::string>> parse_tool_call(const std::string& text);
// What the tool answers, as the observation turn's content, and the value read back from such a turn
// (nullopt for an error or anything else).
std::string tool_result(const std::optional<std::string>& value);
std::optional<std::string> parse_tool_result(const std::string& text);

// The system prompt of every tool-use conversation.
extern const char* const kToolSystemPrompt;

struct ToolDataSet {
  std::vector<Json> sft_train, sft_val;    // TRL {"messages": [...]}
  std::vector<Json> dpo_train, dpo_val;    // TRL {"prompt": [...], "chosen": [...], "rejected": [...], "kind": ...}
  std::vector<Json> copy_train, copy_val;  // TRL {"messages": [...]}: the copy instructions
};

// sft_examples, dpo_pairs and copy_examples per training split; validation splits get a fifth as many
// (copy: a fortieth). A quarter of the SFT examples are plain instructions (arithmetic with worked
// answers) without the tool.
ToolDataSet synthesise_tool_data(const KnowledgeGraph& graph, uint64_t seed, int64_t sft_examples, int64_t dpo_pairs,
                                 int64_t copy_examples);

}  // namespace lt
