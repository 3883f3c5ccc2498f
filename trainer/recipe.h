// Recipes: a training run as a list of stages, each with its own data, sequence length, RoPE theta,
// learning-rate schedule and batch, run in order by one Trainer (docs/architecture.md §9). Ling's
// pre-training is three: 4K context with theta 10K and the WSD schedule, then 16K with theta 600K,
// then an inverse-square-root anneal on curated data.
//
// A recipe is JSON:
//   {"model": "tiny", "seed": 1, "routing_warmup": 50,
//    "stages": [{"name": "base", "steps": 600, "seq": 128, "batch": 16, "rope_theta": 10000,
//                "lr_schedule": "wsd", "lr": 3e-3, ...}, ...]}
// Every stage key has a default (trainer/stage_settings.h, one table), and `lingtrain pretrain` without
// --recipe builds a one-stage recipe from its flags (the same keys, "--warmup-steps" for "warmup_steps").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/json.h"
#include "trainer/stage_settings.h"

namespace lt {

struct Recipe {
  std::string model = "tiny";  // a preset name or a config.json path
  std::string init;            // a checkpoint to start from (its config, weights, tokenizer); "": fresh weights
  uint64_t seed = 1;
  int64_t routing_warmup = 50;  // stochastic routing warmup steps, counted over the whole run
  std::vector<StageSettings> stages;

  // Parses and validates (every error names `source` and the key); unknown keys are errors too.
  static Recipe from_json(const Json& json, const std::string& source);
  Json to_json() const;
  int64_t total_steps() const;
};

// The built-in recipes by name ("tiny": the three Ling stages scaled to the embedded corpus), or a
// recipe file.
Recipe resolve_recipe(const std::string& name_or_path);
std::vector<std::string> builtin_recipe_names();

}  // namespace lt
