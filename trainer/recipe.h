// Recipes: a training run as a list of stages, each with its own data, sequence length, RoPE theta,
// learning-rate schedule and batch, run in order by one Trainer (docs/architecture.md §9). Ling's
// pre-training is three: 4K context with theta 10K and the WSD schedule, then 16K with theta 600K,
// then an inverse-square-root anneal on curated data.
//
// A recipe is JSON:
//   {"model": "tiny", "seed": 1, "routing_warmup": 50,
//    "stages": [{"name": "base", "steps": 600, "seq": 128, "batch": 16, "rope_theta": 10000,
//                "lr_schedule": "wsd", "lr": 3e-3, ...}, ...]}
// Every stage key has a default (StageSettings), and `lingtrain pretrain` without --recipe builds a
// one-stage recipe from its flags (the same keys, "--warmup-steps" for "warmup_steps").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/json.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

namespace lt {

struct StageSettings {
  std::string name = "pretrain";
  // What the stage trains: "pretrain" (next-token loss on token shards), "sft" (assistant tokens of
  // packed conversations, data/val JSONL) or "dpo" (preference pairs, data/val JSONL; trainer/dpo.h).
  std::string kind = "pretrain";
  double beta = 0.1;        // dpo: the DPO temperature
  double rpo_alpha = 0.05;  // dpo: the weight of the NLL term on the chosen response (Ling's 0.05)
  std::string reference;    // dpo: the reference checkpoint (the run's starting one)
  // The MoE load-balance and z-loss weights during the stage; < 0 keeps the model's.
  double aux_loss_coef = -1, z_loss_coef = -1;
  double epochs = 0;        // sft/dpo: the passes over the data the steps were sized for (0: steps given)
  int64_t steps = 1500;
  int64_t batch = 16;  // sequences per micro-batch
  int64_t seq = 128;
  int64_t accum = 1;   // micro-batches per step (gradient accumulation)
  double rope_theta = 0;  // 0: keep the model's
  std::string data, val;  // token shards; empty data: the embedded corpus (and its held-out part)
  LRSchedule schedule;    // kind, peak (lr), min_lr, warmup_steps, halve_at; total_steps = steps
  int64_t batch_warmup_start = 0, batch_warmup_steps = 0;  // batch-size warmup, in sequences
  double clip = 1.0;
  double weight_decay = 0.1;

  BatchRamp ramp() const { return {batch_warmup_start, batch * accum, batch_warmup_steps}; }
  // Micro-batches of step s of this stage under the batch ramp (whole micro-batches, at least one).
  int64_t micro_batches_at(int64_t step) const;
  // The tokens the whole stage consumes, summed over its steps' micro-batches: the wsd halving point
  // is a fraction of this, so a batch ramp moves it as it should.
  double total_tokens() const;
};

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
