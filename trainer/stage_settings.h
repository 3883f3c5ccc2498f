// The settings of one stage of a recipe (trainer/recipe.h), declared once in one table from which the
// StageSettings fields, the recipe JSON keys (read and written), the command-line flags and their help
// are all made ("--warmup-steps" for "warmup_steps"). Adding a setting is one line of
// LT_STAGE_SETTINGS.
//
// The table is an X-macro rather than rows of member pointers: one line then declares the field, its
// type and its defaults together, so a row cannot name a field that does not exist or give a default
// of another type, and the reader, the writer and the flags cannot miss a field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/json.h"
#include "optim/schedule.h"

namespace lt {

// What a stage trains: next-token loss on token shards, the assistant tokens of packed conversations
// (SFT), or preference pairs (DPO, trainer/dpo.h).
enum class StageKind { Pretrain, Sft, Dpo };
const char* stage_kind_name(StageKind kind);  // "pretrain", "sft", "dpo"
// Fails with "<where>: kind must be pretrain, sft or dpo, got '<name>'".
StageKind parse_stage_kind(const std::string& name, const std::string& where);

// Where a setting applies (a mask of kinds): its flag exists on those commands, and a stage's JSON
// holds it only for those kinds.
constexpr unsigned kind_bit(StageKind kind) { return 1u << static_cast<unsigned>(kind); }
constexpr unsigned kAnyKind = kind_bit(StageKind::Pretrain) | kind_bit(StageKind::Sft) | kind_bit(StageKind::Dpo);
constexpr unsigned kPostTraining = kind_bit(StageKind::Sft) | kind_bit(StageKind::Dpo);
constexpr unsigned kDpoOnly = kind_bit(StageKind::Dpo);

// A stage's training data: one source (token shards: files and globs separated by commas; for sft and dpo
// a JSONL file), or a pre-training mixture of named sources with weights (data/batch_sampler.h). In a
// recipe, a string or a list of {"name", "path", "weight"}; on the command line, the string or
// "NAME@WEIGHT=PATHS;NAME@WEIGHT=PATHS" ("web@0.7=web/*.bin;code@0.3=code/*.bin").
struct DataSource {
  std::string name;  // "" for the one source of plain data
  std::string path;
  double weight = 1;
  bool operator==(const DataSource&) const = default;
};
struct DataSpec {
  std::vector<DataSource> sources;  // empty: none given

  bool empty() const { return sources.empty(); }
  bool is_mixture() const { return sources.size() > 1 || (!sources.empty() && !sources[0].name.empty()); }
  // The one source's path ("" when none): what sft and dpo read.
  std::string path() const { return sources.empty() ? std::string() : sources[0].path; }
  // Fails naming `where` on a malformed entry, a repeated name or a weight that is not > 0.
  static DataSpec from_json(const Json& json, const std::string& where);
  Json to_json() const;
  bool operator==(const DataSpec&) const = default;
};

enum StageKeyTraits : unsigned {
  kFlag = 1,           // set on the command line too (--warmup-steps), not only in a recipe file
  kFixedMidStage = 2,  // cannot change when resuming in the middle of a stage (the data cursor counts
                       // windows of the saved shape)
  kUnsetBelowZero = 4, // < 0 means "the model's own": written to JSON only when >= 0
  kFixedOnResume = 8,  // cannot change when resuming at all: what the stage is, how its steps were sized
};

// X(type, key, default, sft default, dpo default, kinds, traits, help)
// `default` is the field's (a recipe file's stage of any kind starts from it); the sft and dpo columns
// are what the `sft` and `dpo` commands start from (rows long enough for the embedded tool
// conversations in bytes, a short warmup and a cosine decay to a tenth, steps sized by --epochs).
#define LT_STAGE_SETTINGS(X)                                                                                       \
  X(std::string, name, "pretrain", "sft", "dpo", kAnyKind, 0, "the stage's name in progress lines and metrics")    \
  X(StageKind, kind, StageKind::Pretrain, StageKind::Sft, StageKind::Dpo, kPostTraining, kFixedOnResume,          \
    "pretrain, sft or dpo (a pretrain stage's JSON leaves it out)")                                               \
  X(int64_t, steps, 1500, 0, 0, kAnyKind, kFlag, "optimiser steps of the stage (sft, dpo: 0 sizes them by --epochs)") \
  X(double, epochs, 0, 2, 1, kPostTraining, kFlag | kFixedOnResume, "passes over the data the steps are sized for (0: --steps given)") \
  X(int64_t, batch, 16, 8, 4, kAnyKind, kFlag | kFixedMidStage, "sequences per micro-batch")                     \
  X(int64_t, seq, 128, 512, 1024, kAnyKind, kFlag | kFixedMidStage, "tokens per sequence")                       \
  X(int64_t, accum, 1, 1, 1, kAnyKind, kFlag | kFixedMidStage, "micro-batches per step (gradient accumulation)") \
  X(double, rope_theta, 0, 0, 0, kAnyKind, kFlag, "RoPE theta during the stage (0 keeps the model's)")            \
  X(DataSpec, data, {}, {}, {}, kAnyKind, kFlag,                                                                   \
    "training data: token shards, files and globs separated by commas (pretrain; empty: the embedded corpus), "   \
    "or a mixture NAME@WEIGHT=SHARDS;... ; a JSONL file (sft, dpo)")                                             \
  X(std::string, on_exhausted, "repeat", "repeat", "repeat", kind_bit(StageKind::Pretrain), kFlag | kFixedOnResume, \
    "when a source of the data runs out: repeat (another epoch of it) or end (the stage ends; its steps fit)")    \
  X(std::string, val, "", "", "", kAnyKind, kFlag, "held-out data: token shards or a JSONL file, as --data")       \
  X(std::string, lr_schedule, "cosine", "cosine", "cosine", kAnyKind, kFlag,                                      \
    "cosine, wsd (Ling's: warmup, constant, halved after --halve-at of the tokens), inverse_sqrt or constant")   \
  X(double, lr, 3e-3, 1e-3, 2e-4, kAnyKind, kFlag, "peak learning rate")                                          \
  X(double, min_lr, 3e-4, 1e-4, 2e-5, kAnyKind, kFlag, "where cosine and inverse_sqrt end")                       \
  X(int64_t, warmup_steps, 30, 10, 5, kAnyKind, kFlag, "linear learning-rate warmup steps")                       \
  X(double, halve_at, 0.6, 0.6, 0.6, kAnyKind, kFlag, "wsd: the fraction of the stage's tokens after which the lr halves") \
  X(int64_t, batch_warmup_start, 0, 0, 0, kAnyKind, kFlag, "batch-size warmup: sequences per step at step 0 (0: none)") \
  X(int64_t, batch_warmup_steps, 0, 0, 0, kAnyKind, kFlag, "batch-size warmup: steps to reach --batch x --accum") \
  X(double, clip, 1.0, 1.0, 1.0, kAnyKind, kFlag, "gradient-norm clip (0: none)")                                 \
  X(double, weight_decay, 0.1, 0.0, 0.0, kAnyKind, kFlag, "AdamW weight decay")                                   \
  X(double, aux_loss_coef, -1, -1, -1, kAnyKind, kFlag | kUnsetBelowZero,                                         \
    "MoE load-balance loss weight during the stage (default: the model's)")                                      \
  X(double, z_loss_coef, -1, -1, -1, kAnyKind, kFlag | kUnsetBelowZero,                                           \
    "router z-loss weight during the stage (default: the model's)")                                              \
  X(double, beta, 0.1, 0.1, 0.1, kDpoOnly, kFlag | kFixedOnResume, "the DPO temperature")                                          \
  X(double, rpo_alpha, 0.05, 0.05, 0.05, kDpoOnly, kFlag | kFixedOnResume,                                 \
    "the weight of the NLL term on the chosen response (Ling's 0.05)")                                           \
  X(std::string, reference, "", "", "", kDpoOnly, kFixedOnResume, "the reference checkpoint (the dpo command's --ckpt)")

struct StageSettings {
#define LT_STAGE_FIELD(type, key, default_value, sft_default, dpo_default, kinds, traits, help) \
  type key = default_value;
  LT_STAGE_SETTINGS(LT_STAGE_FIELD)
#undef LT_STAGE_FIELD

  // The learning-rate schedule of the stage (total_steps = steps, at least 1).
  LRSchedule schedule() const;
  BatchRamp ramp() const { return {batch_warmup_start, batch * accum, batch_warmup_steps}; }
  // Micro-batches of step s of this stage under the batch ramp (whole micro-batches, at least one).
  int64_t micro_batches_at(int64_t step) const;
  // The tokens the whole stage consumes, summed over its steps' micro-batches: the wsd halving point
  // is a fraction of this, so a batch ramp moves it as it should.
  double total_tokens() const;
};

// A row of the table as the command line sees it.
struct StageKey {
  enum class Type { Integer, Number, Text, Kind };
  const char* key;
  Type type;
  unsigned kinds;
  unsigned traits;
  const char* help;
  bool applies_to(StageKind kind) const { return (kinds & kind_bit(kind)) != 0; }
  bool has(StageKeyTraits trait) const { return (traits & trait) != 0; }
};
const std::vector<StageKey>& stage_keys();

// The stage the `sft` and `dpo` commands start from (for pretrain: StageSettings{}).
StageSettings stage_defaults(StageKind kind);
// One key's value as help shows it: "512", "0.001", "cosine"; "" where unset (aux_loss_coef -1).
std::string stage_value_text(const StageSettings& stage, const std::string& key);

// An upper bound on the tokens a stage consumes: its steps times the most sequences a step may take
// under the batch ramp (whole micro-batches), times seq. Nothing when that overflows int64: the token
// counters are int64, and the budget and schedule arithmetic must not overflow (undefined behaviour) on
// absurd sizes in a recipe file. Caught by UBSan under tests/fuzz/fuzz_trainer_json.
std::optional<int64_t> stage_token_bound(const StageSettings& stage);

// Reads a stage (unknown keys, wrong types and inconsistent values fail naming `where` and the key).
StageSettings stage_from_json(const JsonObject& object, const std::string& where);
// The keys that apply to the stage's kind, so a pre-training stage reads as it did before post-training
// existed (checkpoints hold their recipe).
Json stage_to_json(const StageSettings& stage);

}  // namespace lt
