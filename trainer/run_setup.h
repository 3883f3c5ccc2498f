// What a run is made of before its first step, each decided once and handed down to the run's parts:
// the recipe (a resumed run's is its checkpoint's, with the command line's stage changes), the
// distribution settings, the world of processes and the device, the matmul precision, the tokenizer,
// the model, and each stage's data.
#pragma once
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/multiple_choice.h"
#include "data/tokenizer.h"
#include "dist/communicator.h"
#include "moe/expert_parallel.h"
#include "model/ling.h"
#include "tensor/kernels.h"
#include "trainer/checkpoint.h"
#include "trainer/run.h"
#include "trainer/stage_batches.h"

namespace lt {

// The run's tokenizer: its tokenizer.json text ("" for the byte tokenizer) and the tokenizer itself.
struct RunTokenizer {
  std::string json_text;
  std::unique_ptr<Tokenizer> tokenizer;
};

class RunSetup {
 public:
  RunSetup(const Recipe& requested, const RunOptions& options);
  ~RunSetup();
  RunSetup(const RunSetup&) = delete;
  RunSetup& operator=(const RunSetup&) = delete;

  const RunOptions& options() const { return options_; }
  const Recipe& recipe() const { return recipe_; }
  bool resuming() const { return !options_.resume.empty(); }
  // Where this rank reads the checkpoint it resumes: under several ranks its own copy of rank 0's, so the
  // machines need not share a filesystem (trainer/checkpoint.h SharedCheckpoint).
  const std::string& resume_folder() const { return resumed_->folder(); }
  // The distribution settings in force: the command line's, or a resumed checkpoint's.
  DistMode dist() const { return dist_; }
  const EditSettings& edit() const { return edit_; }
  // What a checkpoint records of them.
  Json dist_json() const;
  // A resume on another layout than its checkpoint's (another --dist, number of ranks, --shard-group,
  // --expert-parallel or --shard-params):
  // the weights, the training state and the AdamW moments carry over (Checkpointer::restore), the
  // distribution settings are the command line's (the checkpoint's where a resume names none and keeps
  // the mode), and EDiT's own state starts afresh. On the same layout a resume is exact.
  struct Layout {
    DistMode mode = DistMode::DataParallel;
    int world_size = 1;
    int shard_group = 1;
    int expert_parallel = 1;
    bool shard_params = false;
  };
  bool relayout() const { return relayout_; }
  const Layout& checkpoint_layout() const { return checkpoint_layout_; }

  // --expert-parallel G (the command line's, or a resumed checkpoint's where it names none): the world's
  // ranks form groups of G consecutive ranks that split every MoE layer's routed experts, and the ranks
  // holding the same experts (rank mod G) form its copies, averaged as data parallel. A checkpoint holds
  // the whole model, so a resume may change G. Null groups when G is 1.
  int expert_parallel() const { return expert_parallel_; }
  Communicator* expert_group() const { return expert_group_.get(); }
  Communicator* expert_copies() const { return expert_copies_.get(); }
  // The bytes this rank has sent through those groups (0 without them).
  int64_t expert_bytes_sent() const {
    return expert_group_ ? expert_group_->bytes_sent() + expert_copies_->bytes_sent() : 0;
  }
  // --shard-params (the command line's, or a resumed checkpoint's on as many ranks where it names none):
  // every rank holds its part of each layer (dist/parameter_shards.h). Never with one rank.
  bool shard_params() const { return shard_params_; }
  // Whether this rank takes the held-out figures and the sample: rank 0 alone, under expert parallelism
  // rank 0's group, under parameter sharding every rank: the ranks each forward is collective over (rank 0
  // reports).
  bool evaluates() const { return shard_params_ || world_->rank() < expert_parallel_; }

  // Tensors on GPUs travel through NCCL, host data (the agreement between ranks, statistics, EDiT's
  // tables) through MPI; this is the one the model's tensors use.
  Communicator& world() const { return *world_; }
  bool lead() const { return world_->rank() == 0; }
  // Rank 0's progress stream; on the other ranks, one that discards.
  std::FILE* out() const { return out_; }

  // The items of --eval-mc (none without it), read or made before anything is written.
  const std::vector<MultipleChoiceItem>& multiple_choice_items() const { return multiple_choice_items_; }

  LingForCausalLM& model() const { return *model_; }
  const RunTokenizer& tokenizer() const { return tokenizer_; }
  std::string checkpoint_dir() const { return options_.out_dir + "/checkpoint"; }

  // The batches of recipe stage `stage` on this rank. Rank 0 prepares the data first (it generates
  // the embedded corpus when missing, and caches DPO's reference log-probs); the others read what it
  // made once it is complete. Collective. Token shards are mapped, not read: each rank reads the windows
  // it trains on.
  std::unique_ptr<StageBatches> stage_batches(int64_t stage);
  // What the run changed in the model's configuration ("" when nothing): a preset's vocab_size fitted to
  // the tokenizer.
  const std::string& model_note() const { return vocab_note_; }
  // What the run changed in stage `stage`'s settings and says as the stage begins ("" when nothing).
  std::string stage_note(int64_t stage) const;
  // The held-out files of stage `stage` as the last stage_batches made it ("" without).
  std::string heldout_path(int64_t stage) const;

 private:
  void resume_recipe(const Recipe& requested);
  void resume_dist_settings();
  void open_world();
  void open_expert_groups();
  void make_model_and_tokenizer();
  void size_stages();
  std::string check_pretrain_data(StageSettings& stage);
  void prepare_default_corpus(const StageSettings& stage);
  std::vector<SamplerSource> pretrain_sources(const StageSettings& stage);

  const RunOptions& options_;
  Recipe recipe_;
  Json saved_state_;  // the resumed checkpoint's trainer_state.json
  DistMode dist_ = DistMode::DataParallel;
  EditSettings edit_;
  bool relayout_ = false;
  Layout checkpoint_layout_;
  std::unique_ptr<Communicator> host_world_, gpu_world_;
  std::unique_ptr<SharedCheckpoint> resumed_;
  Communicator* world_ = nullptr;
  int expert_parallel_ = 1;
  bool shard_params_ = false;
  std::unique_ptr<Communicator> expert_group_, expert_copies_;
  std::unique_ptr<ExpertGroup> expert_exchange_;  // the MoE layers' view of expert_group_
  Device device_;
  // The run's matmul precision for its whole length, the process's previous one back after it.
  struct MatmulPrecisionScope {
    kernels::MatmulPrecision previous = kernels::matmul_precision();
    explicit MatmulPrecisionScope(kernels::MatmulPrecision p) { kernels::set_matmul_precision(p); }
    ~MatmulPrecisionScope() { kernels::set_matmul_precision(previous); }
  };
  std::optional<MatmulPrecisionScope> precision_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> discard_{nullptr, &std::fclose};
  std::FILE* out_ = nullptr;
  std::unique_ptr<LingForCausalLM> model_;
  RunTokenizer tokenizer_;
  std::vector<MultipleChoiceItem> multiple_choice_items_;
  std::string vocab_note_;
  std::string default_corpus_;  // the embedded corpus's folder, once a stage needed it
  std::string val_path_;        // the last pre-training stage's held-out files
  std::vector<std::string> stage_notes_;
};

}  // namespace lt
