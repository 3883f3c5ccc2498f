#include "trainer/recipe.h"

#include <algorithm>
#include <optional>
#include <set>

#include "tensor/error.h"

namespace lt {

namespace {

const std::set<std::string>& stage_keys() {
  static const std::set<std::string> keys = {
      "name",     "steps", "batch",        "seq",       "accum",         "rope_theta",         "data",
      "val",      "lr",    "min_lr",       "lr_schedule", "warmup_steps", "halve_at",          "batch_warmup_start",
      "batch_warmup_steps", "clip", "weight_decay", "kind", "beta", "rpo_alpha", "reference", "aux_loss_coef",
      "z_loss_coef", "epochs"};
  return keys;
}

void check_known_keys(const Json& json, const std::set<std::string>& known, const std::string& where) {
  for (const auto& [key, value] : json.items())
    LT_CHECK(known.count(key), where, ": unknown key '", key, "'");
}

// An upper bound on the tokens a stage consumes: its steps times the most sequences a step may take
// under the batch ramp (whole micro-batches), times seq. Nothing when that overflows int64: the token
// counters are int64, and the budget and schedule arithmetic must not overflow (undefined behaviour) on
// absurd sizes in a recipe file. Caught by UBSan under tests/fuzz/fuzz_trainer_json.
std::optional<int64_t> stage_token_bound(const StageSettings& s) {
  int64_t sequences = 0, tokens = 0, total = 0;
  if (__builtin_mul_overflow(s.batch, s.accum, &sequences) ||
      __builtin_add_overflow(std::max(sequences, s.batch_warmup_start), s.batch, &sequences) ||
      __builtin_mul_overflow(sequences, s.seq, &tokens) || __builtin_mul_overflow(tokens, s.steps, &total))
    return std::nullopt;
  return total;
}

StageSettings stage_from_json(const JsonObject& o, const std::string& where) {
  check_known_keys(o.json(), stage_keys(), where);
  StageSettings s;
  s.name = o.get<std::string>("name", s.name);
  s.kind = o.get<std::string>("kind", s.kind);
  LT_CHECK(s.kind == "pretrain" || s.kind == "sft" || s.kind == "dpo", where, ": kind must be pretrain, sft or dpo, got '",
           s.kind, "'");
  s.beta = o.get<double>("beta", s.beta);
  s.rpo_alpha = o.get<double>("rpo_alpha", s.rpo_alpha);
  s.reference = o.get<std::string>("reference", s.reference);
  s.aux_loss_coef = o.get<double>("aux_loss_coef", s.aux_loss_coef);
  s.z_loss_coef = o.get<double>("z_loss_coef", s.z_loss_coef);
  s.epochs = o.get<double>("epochs", s.epochs);
  LT_CHECK(s.beta > 0 && s.rpo_alpha >= 0 && s.epochs >= 0, where, ": beta must be > 0, rpo_alpha and epochs >= 0");
  LT_CHECK(s.kind != "dpo" || !s.reference.empty(), where, ": a dpo stage needs 'reference' (a checkpoint)");
  s.steps = o.get<int64_t>("steps", s.steps);
  s.batch = o.get<int64_t>("batch", s.batch);
  s.seq = o.get<int64_t>("seq", s.seq);
  s.accum = o.get<int64_t>("accum", s.accum);
  s.rope_theta = o.get<double>("rope_theta", s.rope_theta);
  s.data = o.get<std::string>("data", s.data);
  s.val = o.get<std::string>("val", s.val);
  LT_CHECK(s.kind == "pretrain" || !s.data.empty(), where, ": a", s.kind == "sft" ? "n " : " ", s.kind,
           " stage needs 'data' (a JSONL file)");
  s.schedule.kind = o.get<std::string>("lr_schedule", "cosine");
  s.schedule.peak = o.get<double>("lr", 3e-3);
  s.schedule.min_lr = o.get<double>("min_lr", 3e-4);
  s.schedule.warmup_steps = o.get<int64_t>("warmup_steps", 30);
  s.schedule.halve_at_fraction = o.get<double>("halve_at", 0.6);
  s.schedule.total_steps = std::max<int64_t>(s.steps, 1);
  s.batch_warmup_start = o.get<int64_t>("batch_warmup_start", s.batch_warmup_start);
  s.batch_warmup_steps = o.get<int64_t>("batch_warmup_steps", s.batch_warmup_steps);
  s.clip = o.get<double>("clip", s.clip);
  s.weight_decay = o.get<double>("weight_decay", s.weight_decay);
  // A post-training stage may leave its steps to its epochs (0: sized when the run packs its data).
  LT_CHECK((s.steps > 0 || (s.steps == 0 && s.kind != "pretrain" && s.epochs > 0)) && s.batch > 0 && s.seq > 0 &&
               s.accum > 0,
           where, ": steps, batch, seq and accum must be > 0");
  LT_CHECK(s.rope_theta >= 0, where, ": rope_theta must be >= 0 (0 keeps the model's)");
  LT_CHECK(s.clip >= 0 && s.weight_decay >= 0, where, ": clip and weight_decay must be >= 0");
  LT_CHECK(s.batch_warmup_start >= 0 && s.batch_warmup_steps >= 0, where,
           ": batch_warmup_start and batch_warmup_steps must be >= 0");
  LT_CHECK(stage_token_bound(s), where, ": steps x batch x accum x seq exceed a 64-bit token count");
  try {
    s.schedule.validate();
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  return s;
}

Json stage_to_json(const StageSettings& s) {
  Json stage = Json{{"name", s.name},
              {"steps", s.steps},
              {"batch", s.batch},
              {"seq", s.seq},
              {"accum", s.accum},
              {"rope_theta", s.rope_theta},
              {"data", s.data},
              {"val", s.val},
              {"lr_schedule", s.schedule.kind},
              {"lr", s.schedule.peak},
              {"min_lr", s.schedule.min_lr},
              {"warmup_steps", s.schedule.warmup_steps},
              {"halve_at", s.schedule.halve_at_fraction},
              {"batch_warmup_start", s.batch_warmup_start},
              {"batch_warmup_steps", s.batch_warmup_steps},
              {"clip", s.clip},
              {"weight_decay", s.weight_decay}};
  // The post-training keys only where they mean something, so a pre-training recipe reads as before.
  if (s.kind != "pretrain") {
    stage["kind"] = s.kind;
    stage["epochs"] = s.epochs;
  }
  if (s.kind == "dpo") {
    stage["beta"] = s.beta;
    stage["rpo_alpha"] = s.rpo_alpha;
    stage["reference"] = s.reference;
  }
  if (s.aux_loss_coef >= 0) stage["aux_loss_coef"] = s.aux_loss_coef;
  if (s.z_loss_coef >= 0) stage["z_loss_coef"] = s.z_loss_coef;
  return stage;
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

int64_t StageSettings::micro_batches_at(int64_t step) const {
  return std::max<int64_t>(1, (ramp().at(step) + batch - 1) / batch);
}

double StageSettings::total_tokens() const {
  // Past the batch ramp every step takes `accum` micro-batches, so only the ramp's steps are walked: a
  // walk over all of a recipe's steps hung on a large step count (tests/fuzz/fuzz_trainer_json).
  const BatchRamp r = ramp();
  const int64_t ramp_end = r.ramp_steps > 0 && r.start > 0 ? std::min(steps, r.ramp_steps) : 0;
  double total = 0;
  for (int64_t s = 0; s < ramp_end; ++s) total += static_cast<double>(micro_batches_at(s) * batch * seq);
  return total + static_cast<double>(steps - ramp_end) * static_cast<double>(accum * batch * seq);
}

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
