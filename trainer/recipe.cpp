#include "trainer/recipe.h"

#include <set>

#include "tensor/error.h"

namespace lt {

namespace {

void check_known_keys(const Json& json, const std::set<std::string>& known, const std::string& where) {
  for (const auto& [key, value] : json.items())
    LT_CHECK(known.count(key), where, ": unknown key '", key, "'");
}

// Ling's three pre-training stages (docs/architecture.md §9.1) scaled to the tiny preset and the
// embedded corpus: the base stage at half the context with theta 10K and Ling's WSD schedule (halved
// at 60% of the stage's tokens), the context doubled with theta 600K at the halved rate (Ling keeps
// the schedule of the stage before), then the inverse-square-root anneal down by 10^3. The longer
// stages halve the batch, so every stage sees 2048 tokens a step.
const char* kTinyRecipe = R"({
  "model": "tiny", "seed": 1, "routing_warmup": 50,
  "stages": [
    {"name": "base", "steps": 600, "batch": 16, "seq": 128, "rope_theta": 10000,
     "lr_schedule": "wsd", "lr": 3e-3, "warmup_steps": 30, "halve_at": 0.6},
    {"name": "long-context", "steps": 200, "batch": 8, "seq": 256, "rope_theta": 600000,
     "lr_schedule": "constant", "lr": 1.5e-3, "warmup_steps": 0},
    {"name": "anneal", "steps": 200, "batch": 8, "seq": 256, "rope_theta": 600000,
     "lr_schedule": "inverse_sqrt", "lr": 1.5e-3, "min_lr": 1.5e-6, "warmup_steps": 0}
  ]
})";

}  // namespace

Recipe Recipe::from_json(const Json& json, const std::string& source) {
  const JsonObject o(json, source);
  check_known_keys(json, {"model", "init", "seed", "routing_warmup", "stages"}, source);
  Recipe r;
  r.model = o.get<std::string>("model", r.model);
  r.init = o.get<std::string>("init", r.init);
  const int64_t seed = o.get<int64_t>("seed", static_cast<int64_t>(r.seed));
  LT_CHECK(seed >= 0, source, ": seed must be >= 0");
  r.seed = static_cast<uint64_t>(seed);
  r.routing_warmup = o.get<int64_t>("routing_warmup", r.routing_warmup);
  LT_CHECK(r.routing_warmup >= 0, source, ": routing_warmup must be >= 0");
  LT_CHECK(json.contains("stages") && json.at("stages").is_array() && !json.at("stages").empty(), source,
           ": 'stages' must be a non-empty array");
  int64_t run_tokens = 0;  // bounds Recipe::total_steps() and the run's token count too
  for (size_t i = 0; i < json.at("stages").size(); ++i) {
    const std::string where = source + ": stage " + std::to_string(i);
    r.stages.push_back(stage_from_json(JsonObject(json.at("stages").at(i), where), where));
    LT_CHECK(!__builtin_add_overflow(run_tokens, *stage_token_bound(r.stages.back()), &run_tokens), source,
             ": the stages together exceed a 64-bit token count");
  }
  return r;
}

Json Recipe::to_json() const {
  Json stages_json = Json::array();
  for (const StageSettings& s : stages) stages_json.push_back(stage_to_json(s));
  Json out{{"model", model}, {"seed", seed}, {"routing_warmup", routing_warmup}, {"stages", stages_json}};
  if (!init.empty()) out["init"] = init;
  return out;
}

int64_t Recipe::total_steps() const {
  int64_t total = 0;
  for (const StageSettings& s : stages) total += s.steps;
  return total;
}

std::vector<std::string> builtin_recipe_names() { return {"tiny"}; }

Recipe resolve_recipe(const std::string& name_or_path) {
  if (name_or_path == "tiny") return Recipe::from_json(parse_json(kTinyRecipe, "built-in recipe tiny"), "recipe tiny");
  return Recipe::from_json(read_json_file(name_or_path), name_or_path);
}

}  // namespace lt
