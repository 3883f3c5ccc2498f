// The embedded post-training data: deterministic, consistent with its knowledge graph (every observation
// is the graph's answer to the call before it, every final answer states the last result), held-out
// splits about held-out entities only, two-hop questions chaining their calls, correct arithmetic, and
// preference pairs whose rejected turn is wrong in the way its kind says.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>

#include "data/chat_template.h"
#include "data/tool_data.h"

namespace lt {
namespace {

const KnowledgeGraph& graph() {
  static const KnowledgeGraph g = build_knowledge_graph(1);
  return g;
}

const ToolDataSet& data() {
  static const ToolDataSet d = synthesise_tool_data(graph(), 1, 400, 200, 80);
  return d;
}

std::string content(const Json& message) { return message.at("content").get<std::string>(); }

TEST(ToolData, DeterministicPerSeed) {
  const ToolDataSet again = synthesise_tool_data(build_knowledge_graph(1), 1, 400, 200, 80);
  EXPECT_EQ(Json(again.sft_train), Json(data().sft_train));
  EXPECT_EQ(Json(again.dpo_val), Json(data().dpo_val));
  EXPECT_NE(Json(synthesise_tool_data(build_knowledge_graph(2), 2, 400, 200, 80).sft_train), Json(data().sft_train));
  EXPECT_EQ(data().sft_train.size(), 400u);
  EXPECT_EQ(data().sft_val.size(), 80u);
  EXPECT_EQ(data().dpo_train.size(), 200u);
  EXPECT_EQ(data().dpo_val.size(), 40u);
}

// Checks one split's SFT conversations against the graph; returns the subjects of the first calls.
std::set<std::string> check_conversations(const std::vector<Json>& records, int64_t& two_hops, int64_t& arithmetic) {
  std::set<std::string> subjects;
  const std::regex sum(R"((\d+) (\+|-|×) (\d+) = (\d+)\.)");  // × is two bytes: no [...] class
  for (const Json& record : records) {
    const Json& messages = record.at("messages");
    conversation_from_json(record, "record");  // loads as a TRL record
    if (messages[0].at("role") != "system") {
      std::smatch m;
      const std::string answer = content(messages[1]);
      EXPECT_TRUE(std::regex_match(answer, m, sum)) << answer;
      if (m.empty()) continue;
      const int64_t a = std::stoll(m[1]), b = std::stoll(m[3]), c = std::stoll(m[4]);
      EXPECT_EQ(m[2] == "+" ? a + b : m[2] == "-" ? a - b : a * b, c) << answer;
      ++arithmetic;
      continue;
    }
    std::string last_result;
    int64_t calls = 0;
    for (size_t i = 2; i + 1 < messages.size(); i += 2) {
      const auto call = parse_tool_call(content(messages[i]));
      EXPECT_TRUE(call.has_value()) << content(messages[i]);
      if (!call) break;
      if (calls == 0) subjects.insert(call->first);
      else EXPECT_EQ(call->first, last_result) << "the second call asks about the first result";
      EXPECT_EQ(content(messages[i + 1]), tool_result(graph().lookup(call->first, call->second)));
      last_result = parse_tool_result(content(messages[i + 1])).value_or("");
      ++calls;
    }
    EXPECT_GE(calls, 1);
    EXPECT_NE(content(messages.back()).find(last_result), std::string::npos) << content(messages.back());
    two_hops += calls == 2;
  }
  return subjects;
}

TEST(ToolData, ConversationsAgreeWithTheGraphAndHoldOutTheirSubjects) {
  std::map<std::string, bool> held_out;
  for (const auto& e : graph().entities) held_out[e.name] = e.held_out;
  int64_t two_hops = 0, arithmetic = 0;
  for (const std::string& subject : check_conversations(data().sft_val, two_hops, arithmetic))
    EXPECT_TRUE(held_out.at(subject)) << subject << " is asked about in validation but not held out";
  for (const std::string& subject : check_conversations(data().sft_train, two_hops, arithmetic))
    EXPECT_FALSE(held_out.at(subject)) << subject << " is held out but asked about in training";
  EXPECT_GT(two_hops, 80);     // about a third of the tool conversations
  EXPECT_GT(arithmetic, 80);   // a quarter of the examples
}

// Copy instructions: the reply is the name in the question, letter for letter; names are made up
// afresh, so validation asks for names that training never showed.
TEST(ToolData, CopyInstructionsRepeatFreshNames) {
  ASSERT_EQ(data().copy_train.size(), 80u);
  ASSERT_EQ(data().copy_val.size(), 5u);
  std::set<std::string> trained;
  for (const auto* split : {&data().copy_train, &data().copy_val})
    for (const Json& record : *split) {
      const Json& messages = record.at("messages");
      conversation_from_json(record, "record");
      ASSERT_EQ(messages.size(), 2u);
      const std::string question = content(messages[0]), name = content(messages[1]);
      EXPECT_EQ(question, "Repeat exactly: " + name);
      EXPECT_NE(name.find(' '), std::string::npos) << name;
      if (split == &data().copy_train) trained.insert(name);
      else EXPECT_EQ(trained.count(name), 0u) << name << " is asked for in validation and in training";
    }
  EXPECT_GT(trained.size(), 75u);
}

TEST(ToolData, PreferencePairsAreWrongAsTheirKindSays) {
  std::map<std::string, int64_t> kinds;
  for (const Json& pair : data().dpo_train) {
    const std::string kind = pair.at("kind").get<std::string>();
    ++kinds[kind];
    const std::string chosen = content(pair.at("chosen")[0]), rejected = content(pair.at("rejected")[0]);
    EXPECT_NE(chosen, rejected);
    EXPECT_NE(pair.at("prompt").back().at("role"), "assistant");
    const auto chosen_call = parse_tool_call(chosen), rejected_call = parse_tool_call(rejected);
    if (kind == "bad_format") {
      EXPECT_TRUE(chosen_call.has_value());
      EXPECT_FALSE(rejected_call.has_value()) << rejected;
    } else if (kind == "wrong_relation") {
      ASSERT_TRUE(rejected_call.has_value());
      EXPECT_EQ(rejected_call->first, chosen_call->first);
      EXPECT_NE(rejected_call->second, chosen_call->second);
    } else if (kind == "wrong_entity") {
      ASSERT_TRUE(rejected_call.has_value());
      EXPECT_NE(rejected_call->first, chosen_call->first);
      EXPECT_EQ(rejected_call->second, chosen_call->second);
    } else {
      EXPECT_EQ(kind, "wrong_answer");
      EXPECT_FALSE(chosen_call.has_value());
    }
    // prompt + chosen is a loadable conversation.
    Json conversation = {{"prompt", pair.at("prompt")}, {"completion", pair.at("chosen")}};
    conversation_from_json(conversation, "pair");
  }
  for (const char* kind : {"bad_format", "wrong_relation", "wrong_entity", "wrong_answer"})
    EXPECT_GT(kinds[kind], 10) << kind;
}

TEST(ToolData, ToolResultsRoundTrip) {
  EXPECT_EQ(parse_tool_result(tool_result(std::string("Valdris \"Old\""))), "Valdris \"Old\"");
  EXPECT_FALSE(parse_tool_result(tool_result(std::nullopt)).has_value());
  EXPECT_FALSE(parse_tool_result(R"({"result": 3})").has_value());
  EXPECT_FALSE(parse_tool_result("not json").has_value());
}

TEST(ToolData, ToolCallsParseOnlyInTheirForm) {
  EXPECT_EQ(tool_call("A \"B\"", "born_in"), R"({"name": "lookup", "arguments": {"entity": "A \"B\"", "relation": "born_in"}})");
  EXPECT_EQ(parse_tool_call(tool_call("A \"B\"", "born_in")), (std::pair<std::string, std::string>{"A \"B\"", "born_in"}));
  EXPECT_TRUE(parse_tool_call(R"({"arguments":{"relation":"r","entity":"e"},"name":"lookup"})").has_value());
  for (const char* bad : {"", "lookup(e, r)", R"({"name": "search", "arguments": {"entity": "e", "relation": "r"}})",
                          R"({"name": "lookup", "arguments": {"entity": "e"}})", R"({"name": "lookup", "arguments": {"entity": 1, "relation": "r"}})",
                          R"({"name": "lookup", "arguments": {"entity": "e", "relation": "r"})"})
    EXPECT_FALSE(parse_tool_call(bad).has_value()) << bad;
}

}  // namespace
}  // namespace lt
