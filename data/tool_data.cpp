#include "data/tool_data.h"

#include <set>

#include "data/random_text.h"
#include "tensor/derive_seed.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace lt {

using namespace random_text;

// Short, because every conversation carries it and the tiny models have short contexts.
const char* const kToolSystemPrompt = "Answer with the tool lookup(entity, relation).";

namespace {

constexpr std::string_view kOnsets[] = {"b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
                                        "br", "dr", "kr", "st", "tr", "th", "sh", "ch"};
constexpr std::string_view kVowels[] = {"a", "e", "i", "o", "u", "ai", "ei", "ou", "ia"};
constexpr std::string_view kCodas[] = {"", "", "", "n", "r", "s", "l", "m", "th", "x"};

std::string capitalized(std::string word) {
  if (!word.empty() && word[0] >= 'a' && word[0] <= 'z') word[0] = static_cast<char>(word[0] - 'a' + 'A');
  return word;
}

// A made-up word of 2-3 syllables, never one already in `taken`.
std::string new_name(Rng& rng, std::set<std::string>& taken, std::string_view suffix = "") {
  for (;;) {
    std::string word;
    const int64_t syllables = between(rng, 2, 3);
    for (int64_t s = 0; s < syllables; ++s) word += cat({str(pick(rng, kOnsets)), str(pick(rng, kVowels))});
    word = capitalized(cat({word, str(pick(rng, kCodas)), str(suffix)}));
    if (taken.insert(word).second) return word;
  }
}

struct Relation {
  const char* name;
  const char* subject_type;
  const char* question;  // {} is the subject
  const char* answer;    // {s} the subject, {v} the value
};

// Many more people and companies than conversations mention twice: a model cannot memorise the names,
// so SFT has to teach it to copy the entity from the question into the call (what held-out questions,
// about unseen entities, measure).
constexpr int kCompanies = 400, kPeople = 2000;

constexpr Relation kRelations[] = {
    {"born_in", "person", "Where was {s} born?", "{s} was born in {v}."},
    {"birth_year", "person", "In which year was {s} born?", "{s} was born in {v}."},
    {"works_for", "person", "Which company does {s} work for?", "{s} works for {v}."},
    {"headquartered_in", "company", "Where is {s} headquartered?", "{s} is headquartered in {v}."},
    {"founded_in", "company", "When was {s} founded?", "{s} was founded in {v}."},
    {"located_in", "city", "In which country is {s}?", "{s} is in {v}."},
    {"capital", "country", "What is the capital of {s}?", "The capital of {s} is {v}."},
};

// Two calls: the second relation asked of the first one's result.
struct TwoHop {
  const char* first;
  const char* second;
  const char* question;
  const char* answer;  // {s} subject, {v} first result, {w} second result
};

constexpr TwoHop kTwoHops[] = {
    {"born_in", "located_in", "In which country was {s} born?", "{s} was born in {v}, in {w}."},
    {"works_for", "headquartered_in", "In which city is the company {s} works for headquartered?",
     "{s} works for {v}, which is headquartered in {w}."},
    {"works_for", "founded_in", "When was the company {s} works for founded?", "{s} works for {v}, founded in {w}."},
};

std::string fill(std::string text, const std::string& s, const std::string& v = "", const std::string& w = "") {
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"{s}", s}, {"{v}", v}, {"{w}", w}}) {
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size()))
      text.replace(at, key.size(), value);
  }
  return text;
}

Json message(const char* role, const std::string& content) { return {{"role", role}, {"content", content}}; }

std::vector<const KnowledgeGraph::Entity*> entities_of(const KnowledgeGraph& graph, const std::string& type,
                                                       std::optional<bool> held_out) {
  std::vector<const KnowledgeGraph::Entity*> out;
  for (const auto& e : graph.entities)
    if (e.type == type && (!held_out || e.held_out == *held_out)) out.push_back(&e);
  return out;
}

const Relation& relation_named(const std::string& name) {
  for (const Relation& r : kRelations)
    if (name == r.name) return r;
  fail("tool data: unknown relation '", name, "'");
}

// A tool-use conversation: system, question, the calls with their observations, the answer.
Json tool_conversation(const KnowledgeGraph& graph, Rng& rng, bool held_out) {
  Json messages = Json::array({message("system", kToolSystemPrompt)});
  auto call = [&](const std::string& entity, const std::string& relation) {
    const std::optional<std::string> value = graph.lookup(entity, relation);
    LT_CHECK(value.has_value(), "tool data: no ", relation, " for ", entity);
    messages.push_back(message("assistant", tool_call(entity, relation)));
    messages.push_back(message("observation", tool_result(value)));
    return *value;
  };
  // Validation asks about held-out people and companies only; training also about places.
  const bool two_hop = chance(rng, 0.35);
  if (two_hop) {
    const TwoHop& hop = pick(rng, kTwoHops);
    const std::string subject = pick_from(rng, entities_of(graph, "person", held_out))->name;
    messages.push_back(message("user", fill(hop.question, subject)));
    const std::string v = call(subject, hop.first);
    const std::string w = call(v, hop.second);
    messages.push_back(message("assistant", fill(hop.answer, subject, v, w)));
    return {{"messages", messages}};
  }
  const Relation* relation = nullptr;
  do relation = &pick(rng, kRelations);
  while (held_out && std::string(relation->subject_type) != "person" && std::string(relation->subject_type) != "company");
  const bool has_held_out = std::string(relation->subject_type) == "person" || std::string(relation->subject_type) == "company";
  const std::string subject =
      pick_from(rng, entities_of(graph, relation->subject_type, has_held_out ? std::optional<bool>(held_out) : std::nullopt))
          ->name;
  messages.push_back(message("user", fill(relation->question, subject)));
  const std::string v = call(subject, relation->name);
  messages.push_back(message("assistant", fill(relation->answer, subject, v)));
  return {{"messages", messages}};
}

// A copy instruction: a made-up two-word name, to be repeated exactly.
Json copy_conversation(Rng& rng) {
  std::set<std::string> taken;
  const std::string name = cat({new_name(rng, taken), " ", new_name(rng, taken)});
  return {{"messages", {message("user", cat({"Repeat exactly: ", name})), message("assistant", name)}}};
}

// Plain instructions without the tool: arithmetic with the worked answer.
Json arithmetic_conversation(Rng& rng) {
  const int64_t a = between(rng, 2, 99), b = between(rng, 2, 99);
  switch (rng.below(3)) {
    case 0:
      return {{"messages", {message("user", cat({"What is ", std::to_string(a), " + ", std::to_string(b), "?"})),
                            message("assistant", cat({std::to_string(a), " + ", std::to_string(b), " = ",
                                                      std::to_string(a + b), "."}))}}};
    case 1: {
      const int64_t big = std::max(a, b), small = std::min(a, b);
      return {{"messages",
               {message("user", cat({"What is ", std::to_string(big), " minus ", std::to_string(small), "?"})),
                message("assistant", cat({std::to_string(big), " - ", std::to_string(small), " = ",
                                          std::to_string(big - small), "."}))}}};
    }
    default: {
      const int64_t x = a % 13 + 2, y = b % 13 + 2;
      return {{"messages", {message("user", cat({"What is ", std::to_string(x), " times ", std::to_string(y), "?"})),
                            message("assistant", cat({std::to_string(x), " × ", std::to_string(y), " = ",
                                                      std::to_string(x * y), "."}))}}};
    }
  }
}

// Another value the relation takes in the graph than `value` (a plausible wrong answer).
std::string other_value(const KnowledgeGraph& graph, Rng& rng, const std::string& relation, const std::string& value) {
  std::vector<std::string> values;
  for (const auto& [key, v] : graph.facts)
    if (key.second == relation && v != value) values.push_back(v);
  return pick_from(rng, values);
}

// A preference pair from a tool conversation: the prompt runs up to one assistant turn, which is the
// chosen response; the rejected one is a corrupted copy of it.
Json preference_pair(const KnowledgeGraph& graph, Rng& rng, const Json& conversation) {
  const Json& messages = conversation.at("messages");
  std::vector<size_t> turns;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].at("role") == "assistant") turns.push_back(i);
  const size_t target = pick_from(rng, turns);
  const std::string chosen = messages[target].at("content").get<std::string>();
  const std::optional<std::pair<std::string, std::string>> called = parse_tool_call(chosen);
  std::string rejected, kind;
  if (called) {
    const auto& [entity, relation] = *called;
    std::vector<std::string> other_relations;  // of the same subject type
    for (const Relation& r : kRelations)
      if (r.name != relation && std::string(r.subject_type) == relation_named(relation).subject_type)
        other_relations.push_back(r.name);
    const uint64_t draw = rng.below(3);
    if (draw == 0 && !other_relations.empty()) {
      rejected = tool_call(entity, pick_from(rng, other_relations));
      kind = "wrong_relation";
    } else if (draw <= 1) {
      std::string type;
      for (const auto& e : graph.entities)
        if (e.name == entity) type = e.type;
      std::string other = entity;
      while (other == entity) other = pick_from(rng, entities_of(graph, type, std::nullopt))->name;
      rejected = tool_call(other, relation);
      kind = "wrong_entity";
    } else {
      // The same call with its JSON broken: the content is right, only the format is wrong.
      rejected = chosen.substr(0, chosen.size() - 1);
      kind = "bad_format";
    }
  } else {
    // A final answer: the last value it states replaced by another value of the same relation.
    const std::string value = *parse_tool_result(messages[target - 1].at("content").get<std::string>());
    const auto last_call = parse_tool_call(messages[target - 2].at("content").get<std::string>());
    const std::string wrong = other_value(graph, rng, last_call->second, value);
    rejected = chosen;
    rejected.replace(rejected.rfind(value), value.size(), wrong);
    kind = "wrong_answer";
  }
  Json prompt = Json::array();
  for (size_t i = 0; i < target; ++i) prompt.push_back(messages[i]);
  Json pair = {{"prompt", prompt},
               {"chosen", Json::array({message("assistant", chosen)})},
               {"rejected", Json::array({message("assistant", rejected)})},
               {"kind", kind}};
  // The broken call differs from the right one in format only: format-recovery DPO (data/chat_dataset.h).
  if (kind == "bad_format") pair["format_only"] = true;
  return pair;
}

}  // namespace

std::optional<std::string> KnowledgeGraph::lookup(const std::string& entity, const std::string& relation) const {
  const auto found = facts.find({entity, relation});
  if (found == facts.end()) return std::nullopt;
  return found->second;
}

Json KnowledgeGraph::to_json() const {
  Json out = {{"entities", Json::array()}, {"facts", Json::array()}};
  for (const Entity& e : entities)
    out["entities"].push_back({{"name", e.name}, {"type", e.type}, {"held_out", e.held_out}});
  for (const auto& [key, value] : facts)
    out["facts"].push_back({{"entity", key.first}, {"relation", key.second}, {"value", value}});
  return out;
}

KnowledgeGraph KnowledgeGraph::from_json(const Json& json, const std::string& source) {
  KnowledgeGraph graph;
  LT_CHECK(json.is_object() && json.contains("entities") && json.at("entities").is_array() && json.contains("facts") &&
               json.at("facts").is_array(),
           source, ": a knowledge graph needs 'entities' and 'facts' lists");
  for (const Json& e : json.at("entities")) {
    const JsonObject o(e, source, "entities");
    graph.entities.push_back({o.get<std::string>("name"), o.get<std::string>("type"), o.get<bool>("held_out", false)});
  }
  for (const Json& f : json.at("facts")) {
    const JsonObject o(f, source, "facts");
    graph.facts[{o.get<std::string>("entity"), o.get<std::string>("relation")}] = o.get<std::string>("value");
  }
  return graph;
}

KnowledgeGraph build_knowledge_graph(uint64_t seed) {
  Rng rng(derive_seed(seed, 1));
  KnowledgeGraph graph;
  std::set<std::string> taken;
  std::vector<std::string> countries, cities, companies;
  auto add = [&](const std::string& name, const char* type, bool held_out) {
    graph.entities.push_back({name, type, held_out});
  };
  for (int i = 0; i < 12; ++i) {
    countries.push_back(new_name(rng, taken, pick(rng, {"ia", "land", "stan", "a"})));
    add(countries.back(), "country", false);
  }
  for (int i = 0; i < 48; ++i) {
    cities.push_back(new_name(rng, taken));
    add(cities.back(), "city", false);
    graph.facts[{cities.back(), "located_in"}] = countries[static_cast<size_t>(i) % countries.size()];
    if (i < static_cast<int>(countries.size())) graph.facts[{countries[static_cast<size_t>(i)], "capital"}] = cities.back();
  }
  for (int i = 0; i < kCompanies; ++i) {
    companies.push_back(cat({new_name(rng, taken), " ", str(pick(rng, {"Works", "Labs", "Trading", "Foods", "Motors"}))}));
    add(companies.back(), "company", i % 5 == 4);
    graph.facts[{companies.back(), "headquartered_in"}] = pick_from(rng, cities);
    graph.facts[{companies.back(), "founded_in"}] = std::to_string(between(rng, 1850, 2020));
  }
  for (int i = 0; i < kPeople; ++i) {
    const std::string person = cat({new_name(rng, taken), " ", new_name(rng, taken)});
    add(person, "person", i % 5 == 4);
    graph.facts[{person, "born_in"}] = pick_from(rng, cities);
    graph.facts[{person, "birth_year"}] = std::to_string(between(rng, 1940, 2005));
    graph.facts[{person, "works_for"}] = pick_from(rng, companies);
  }
  return graph;
}

// Spelled out rather than dumped: nlohmann::json sorts keys, and the call reads "name" first.
std::string tool_call(const std::string& entity, const std::string& relation) {
  return cat({R"({"name": "lookup", "arguments": {"entity": )", Json(entity).dump(), R"(, "relation": )",
              Json(relation).dump(), "}}"});
}

std::optional<std::pair<std::string, std::string>> parse_tool_call(const std::string& text) {
  const Json call = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!call.is_object() || call.value("name", Json()) != "lookup" || !call.contains("arguments")) return std::nullopt;
  const Json& arguments = call.at("arguments");
  if (!arguments.is_object() || !arguments.contains("entity") || !arguments.contains("relation") ||
      !arguments.at("entity").is_string() || !arguments.at("relation").is_string())
    return std::nullopt;
  return std::pair{arguments.at("entity").get<std::string>(), arguments.at("relation").get<std::string>()};
}

std::string tool_result(const std::optional<std::string>& value) {
  return value ? cat({R"({"result": )", Json(*value).dump(), "}"}) : std::string(R"({"error": "no such fact"})");
}

std::optional<std::string> parse_tool_result(const std::string& text) {
  const Json result = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!result.is_object() || !result.contains("result") || !result.at("result").is_string()) return std::nullopt;
  return result.at("result").get<std::string>();
}

ToolDataSet synthesise_tool_data(const KnowledgeGraph& graph, uint64_t seed, int64_t sft_examples, int64_t dpo_pairs,
                                 int64_t copy_examples) {
  LT_CHECK(sft_examples >= 5 && dpo_pairs >= 5 && copy_examples >= 5,
           "tool data: at least 5 SFT examples, 5 pairs and 5 copy instructions per split");
  ToolDataSet set;
  auto fill_split = [&](std::vector<Json>& sft, std::vector<Json>& dpo, int64_t n_sft, int64_t n_dpo, bool held_out,
                        uint64_t stream) {
    Rng rng(derive_seed(seed, stream));
    for (int64_t i = 0; i < n_sft; ++i)
      sft.push_back(i % 4 == 3 ? arithmetic_conversation(rng) : tool_conversation(graph, rng, held_out));
    for (int64_t i = 0; i < n_dpo; ++i) dpo.push_back(preference_pair(graph, rng, tool_conversation(graph, rng, held_out)));
  };
  fill_split(set.sft_train, set.dpo_train, sft_examples, dpo_pairs, false, 2);
  fill_split(set.sft_val, set.dpo_val, std::max<int64_t>(sft_examples / 5, 5), std::max<int64_t>(dpo_pairs / 5, 5), true, 3);
  // Their own stream: the tool conversations stay the same whatever the number of copy instructions.
  Rng copy_rng(derive_seed(seed, 4));
  for (int64_t i = 0; i < copy_examples; ++i) set.copy_train.push_back(copy_conversation(copy_rng));
  for (int64_t i = 0; i < std::max<int64_t>(copy_examples / 40, 5); ++i) set.copy_val.push_back(copy_conversation(copy_rng));
  return set;
}

}  // namespace lt
