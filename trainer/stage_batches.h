// Where a stage's micro-batches come from, by the stage's kind (trainer/recipe.h), and how its held-out
// data is scored. The run (trainer/run.h) is written once against this; the kinds differ only here and
// in their objective:
//   pretrain  windows of token shards, one source or a mixture (data/batch_sampler.h); held-out: the
//             next-token loss
//   sft       conversations packed into rows (data/chat_dataset.h, data/packing.h), loss on the
//             assistant tokens, token-mean over the step; held-out: the same loss on the val file
//   dpo       preference pairs packed into rows, DPO against reference log-probs computed once and
//             cached (trainer/dpo.h); held-out: TRL's eval_ metrics
#pragma once
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>
#include <string>

#include "data/batch_sampler.h"
#include "data/tokenizer.h"
#include "io/json.h"
#include "trainer/recipe.h"
#include "trainer/trainer.h"

namespace lt {

class StageBatches {
 public:
  virtual ~StageBatches() = default;
  virtual TokenBatch next() = 0;  // this rank's next micro-batch
  virtual DataCursor cursor() const = 0;
  // Fails when the cursor cannot belong to this data (saved with other data, seed or shapes).
  virtual void restore(const DataCursor& cursor) = 0;
  // Held-out figures of `model`: "val_loss" and, for DPO, TRL's eval_ metrics; empty without held-out
  // data. limit_tokens: about how many held-out tokens to use (0: all).
  virtual Json evaluate(LingForCausalLM& model, int64_t limit_tokens) = 0;
  // The stage's own figures of a step for its metrics record (DPO's rewards/...), from the step's
  // objective_stats summed over the ranks.
  virtual void add_step_metrics(const StepStats& stats, Json& record) const;
  virtual Objective objective() const;
  // For the stage's first progress line: the data and its size.
  const std::string& description() const { return description_; }

 protected:
  std::string description_;
};

// Pre-training: windows of the sources B x T (one source, or a mixture); held-out loss over `val` (none
// without). A mixture's metrics records hold each source's tokens and epoch so far ("sources").
std::unique_ptr<StageBatches> window_batches(std::vector<SamplerSource> sources, std::optional<TokenShards> val,
                                             int64_t B, int64_t T, uint64_t seed, int rank, int world_size);

// What the post-training kinds read besides the stage: the run's tokenizer, and where DPO caches the
// reference log-probs.
struct PostTrainingInputs {
  const Tokenizer* tokenizer = nullptr;
  std::string tokenizer_json;  // "" for the byte tokenizer (part of the reference cache key)
  std::string cache_dir;       // DPO: <out>/reference
  uint64_t seed = 1;
  int rank = 0, world_size = 1;
  std::FILE* progress = stderr;
  Device device = Device::cpu();  // where the reference model computes (the run's device)
};

// SFT or DPO batches of `stage` (stage.kind). Reports on `progress` how the data packed and what was
// skipped (longer than the stage's seq + 1, identical pairs).
std::unique_ptr<StageBatches> post_training_batches(const StageSettings& stage, const PostTrainingInputs& inputs);

// Reads and packs a post-training stage's data and held-out files (failing on what cannot be trained
// on) and returns the train rows: run before anything is written, and to size a stage in epochs.
int64_t packed_train_rows(const StageSettings& stage, const Tokenizer& tokenizer);

}  // namespace lt
