// Training checkpoints: a folder that is at once a Hugging Face model folder and a resumable state.
//
//   config.json             the model config (bailing_moe keys)
//   model.safetensors       f32 weights under the Hugging Face names (the whole model, whatever the layout:
//                           under expert parallelism rank 0 gathers every rank's experts and writes them)
//   optimizer.safetensors   AdamW moments by lingtrain parameter name; its metadata holds the update count
//   trainer_state.json      the TrainState (trainer/train_state.h) and the recipe being run
//   tokenizer.json          the run's BPE tokenizer, as given (absent: the byte tokenizer)
//   edit/rank-NNNNN.safetensors   EDiT runs only: each rank's own state (its replica's shard of the
//                           values and AdamW moments, the anchor and outer momentum, its TrainState and
//                           detectors in the metadata); optimizer.safetensors is then absent and
//                           model.safetensors holds replica 0
//
// The folder is written atomically (io/atomic_file.h): a run killed at any moment leaves the previous
// checkpoint complete. A run's latest checkpoint is <out>/checkpoint; with a history (--keep-checkpoints,
// --keep-every) the ones before it move, whole, to <out>/checkpoints/step-NNNNNNNN (the step they end).
// Released models arrive as Hugging Face folders whose weights may be sharded
// (model.safetensors.index.json naming several shard files); the loaders read both forms.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <memory>

#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "model/ling.h"
#include "optim/adamw.h"

namespace lt {

// tokenizer_json: the text of the run's tokenizer.json, empty for the byte tokenizer. write_extra, when
// given, adds files to the folder before it is published (it gets the staging path). weights_dtype: the
// dtype of model.safetensors (f32, or bf16 for a smaller export; the optimiser state stays f32, and a
// resume continues from the rounded weights).
void save_checkpoint(const std::string& dir, LingForCausalLM& model, const AdamW* optimizer,
                     const Json& trainer_state, const std::string& tokenizer_json = {},
                     const std::function<void(const std::string&)>& write_extra = {},
                     DType weights_dtype = DType::F32);
// What the folder holds of a model and its optimiser, for a writer that assembles them itself (the
// experts of an expert-parallel run, gathered from their ranks): the whole model's parameters by
// lingtrain name and, when has_moments, the AdamW moments by name (AdamW::state()) and the update count.
struct CheckpointTensors {
  NamedTensors parameters;
  bool has_moments = false;
  NamedTensors moments;
  int64_t steps_taken = 0;
};
// retire: what becomes of the checkpoint the new one replaces (write_directory_atomic's; default: removed).
void save_checkpoint(const std::string& dir, const LingConfig& config, const CheckpointTensors& tensors,
                     const Json& trainer_state, const std::string& tokenizer_json,
                     const std::function<void(const std::string&)>& write_extra, DType weights_dtype,
                     const std::function<void(const std::string&)>& retire = {});

// The history of a run whose output folder is out_dir: its kept checkpoints, oldest step first.
struct KeptCheckpoint {
  int64_t step = 0;
  std::string dir;
};
std::string checkpoint_history_dir(const std::string& out_dir);  // <out>/checkpoints
std::vector<KeptCheckpoint> checkpoint_history(const std::string& out_dir);
// The step a checkpoint folder ends (its trainer_state.json's).
int64_t checkpoint_step(const std::string& dir);
// The checkpoint `previous`, replaced by a new one of step new_step, moves into the history when it is one
// of the newest keep - 1 before it or its step is a multiple of keep_every (> 0); else it is removed, as
// are the history's checkpoints beyond those and any of step new_step or later (a timeline the run left
// when it went back to an older checkpoint). Every move is a rename, so a kill leaves whole checkpoints.
void retire_checkpoint(const std::string& previous, const std::string& out_dir, int64_t new_step, int64_t keep,
                       int64_t keep_every);
// The output folder of a run resumed from `checkpoint`: the folder that holds it, or for a kept one
// (<out>/checkpoints/step-N) the folder that holds the history.
std::string run_folder_of_checkpoint(const std::string& checkpoint);

// A checkpoint every rank of a run reads (--resume, or the one a diverged run goes back to) when the
// machines may share no filesystem: rank 0 finds its complete folder (checkpoint_folder below) and sends
// it (dist/share_folder.h); every other rank reads its own copy, in the system's temporary folder, removed
// with this. Collective; alone, nothing moves.
class SharedCheckpoint {
 public:
  SharedCheckpoint(Communicator& world, const std::string& dir);
  ~SharedCheckpoint();
  SharedCheckpoint(const SharedCheckpoint&) = delete;
  SharedCheckpoint& operator=(const SharedCheckpoint&) = delete;
  // Where this rank reads it.
  const std::string& folder() const { return folder_; }

 private:
  std::string folder_, copy_;  // copy_: this rank's copy ("" on rank 0 and alone)
};

// The folder to read: `dir`, or the previous complete one if a writer died mid-swap. Fails naming dir
// when no checkpoint exists there.
std::string checkpoint_folder(const std::string& dir);
LingConfig load_checkpoint_config(const std::string& dir);
void load_checkpoint_weights(const std::string& dir, LingForCausalLM& model);
Json load_trainer_state(const std::string& dir);
// The text of the checkpoint's tokenizer.json; empty when it has none (a byte-tokenizer run).
std::string load_checkpoint_tokenizer_json(const std::string& dir);
// The tokenizer a command uses: the --tokenizer file when given, else the checkpoint's tokenizer.json
// when it has one (checkpoint may be empty), else the byte tokenizer. Fails, naming the file, when its
// vocabulary does not fit the model's vocab_size.
std::unique_ptr<Tokenizer> resolve_tokenizer(const std::string& flag_path, const std::string& checkpoint,
                                             int64_t model_vocab_size);
// The moments of the model's parameters (of its own experts, under expert parallelism).
void load_checkpoint_optimizer(const std::string& dir, const LingForCausalLM& model, AdamW& optimizer);

// How far apart two checkpoints' weights are (two layouts' runs, a resume, two machines): per tensor the
// relative difference ||a - b|| / ||b|| (f64; 0 when both are zero), the largest of them and its tensor,
// and the largest elementwise |a - b|. Both must hold the same tensors in the same shapes (one clear line
// naming the first that differs).
struct WeightsDifference {
  int64_t tensors = 0;
  double max_relative = 0, max_abs = 0;
  std::string worst;  // the tensor of max_relative ("" when every tensor is identical)
};
WeightsDifference compare_checkpoint_weights(const std::string& dir_a, const std::string& dir_b);

// Where a checkpoint folder keeps EDiT rank r's own state (edit/rank-NNNNN.safetensors).
std::string checkpoint_rank_path(const std::string& folder, int rank);

// The AdamW moments of a checkpoint over the whole flat layout of `params` (host f32
// [params.layout_numel()], zeros in the padding; this model's own experts where it holds a slice of them),
// whatever layout wrote them: optimizer.safetensors by parameter name, or EDiT's per-rank files
// (world_size ranks in replicas of shard_group ranks, each replica's shards end to end, or of
// expert_parallel ranks, each holding its own experts; under parameter sharding the replica's ranks' parts
// of every layer), the replicas' moments averaged, since after a sync the replicas share their weights but
// each kept its own moments; with the update count (the largest of the ranks': A-EDiT's replicas take
// different counts). What a resume on another layout gives its optimiser, whole or a part of it.
struct WholeMoments {
  Tensor exp_avg, exp_avg_sq;
  int64_t steps_taken = 0;
};
// The layout a checkpoint was written in: per-rank shards (EDiT) or not, the mesh that wrote them, and
// whether its replicas' ranks held parts of every layer (parameter sharding).
struct CheckpointLayout {
  bool per_rank_shards = false;
  int world_size = 1, shard_group = 1, expert_parallel = 1;
  bool shard_params = false;
};
WholeMoments load_checkpoint_moments(const std::string& dir, const LingForCausalLM& model, const FlatParameters& params,
                                     const CheckpointLayout& from);

}  // namespace lt
