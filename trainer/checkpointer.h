// Saving and restoring a run (trainer/checkpoint.h has the folder's format): the weights, the
// optimiser, the training state, the recipe and the run's settings, the spike guard, and, where the
// ranks hold different states (EDiT's shards), every rank's own: each rank's share travels to rank 0,
// which writes them all into the one folder, and each rank reads its own back. Under expert parallelism
// the experts of rank 0's group travel to rank 0 too, and under parameter sharding every rank's part of
// the weights and moments, so the folder holds the whole model.
#pragma once
#include <string>

#include "dist/parameter_shards.h"
#include "io/background_task.h"
#include "io/safetensors.h"
#include "optim/spike_guard.h"
#include "trainer/run_setup.h"
#include "trainer/trainer.h"

namespace lt {

// A rank's own part of a checkpoint, for a distribution strategy whose ranks differ.
class RankState {
 public:
  virtual ~RankState() = default;
  // The tensors (on any device) and the figures this rank alone holds.
  virtual NamedTensors own_tensors() const = 0;
  virtual Json own_json() const = 0;
  // Takes them back from this rank's file and its figures (which name the file in errors).
  virtual void load_own(const SafetensorsFile& file, const JsonObject& own) = 0;
};

class Checkpointer {
 public:
  // rank_state: null when every rank holds the same state (rank 0's optimiser is everyone's). shards: under
  // parameter sharding, what holds each rank's part of the weights and moments (gathered to rank 0 to save,
  // each rank's part kept on restore), else null.
  Checkpointer(RunSetup& setup, Trainer& trainer, SpikeGuard& guard, RankState* rank_state,
               ParameterShards* shards = nullptr);

  // Writes <out>/checkpoint; `seq_len` is the current stage's. Collective when the ranks differ. With
  // --ckpt-async on, the state is copied to host memory here and written by a background thread while
  // training goes on (waiting first for the write before it); wait() returns once it is on disk.
  void save(int64_t seq_len);
  void wait() { writer_.wait(); }
  // Reads `dir` into the run: to resume (the guard's state too), and to go back after diverged steps
  // (reloading: the guard keeps its count of reloads and its cuts).
  void restore(const std::string& dir, bool reloading);
  const std::string& dir() const { return dir_; }
  // Where a run that diverged goes back to, once the writes finished: the latest checkpoint on its first
  // reload since the last save, the kept one before it (--keep-checkpoints) on the second, and so on down
  // to the oldest kept.
  std::string reload_dir();

 private:
  RunSetup& setup_;
  Trainer& trainer_;
  SpikeGuard& guard_;
  RankState* rank_state_;
  ParameterShards* shards_;
  std::string dir_;
  int64_t reloads_since_save_ = 0;
  BackgroundTask writer_;  // declared last: destroyed first, so a write in flight ends before the rest
};

}  // namespace lt
