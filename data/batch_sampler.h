// Batches of next-token windows over a token array (a shard read with read_token_shard_tensor).
//
// A window of T + 1 consecutive tokens gives one row: inputs are its first T tokens, targets its last
// T (the same tokens shifted by one). Training windows tile the array at stride T from an offset, and
// each epoch visits them all once in a shuffled order; the offset (in [0, T)) and the order are drawn
// from (seed, epoch), so that window boundaries move between epochs and the whole sequence of batches
// is a function of the seed. The cursor (epoch, position in that epoch's order) is all the state there
// is: saved in a checkpoint and restored into a sampler built with the same tokens, seed, batch size,
// sequence length and world size, it continues with exactly the batches the original would have given.
//
// With world_size > 1, each step takes world_size * B windows from the order and rank r keeps rows
// [r*B, (r+1)*B): the ranks see disjoint windows and share one cursor.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace lt {

struct TokenBatch {
  Tensor inputs;     // i32 [B, T] on the CPU
  Tensor targets;    // i32 [B, T]: targets[b, t] = the token after inputs[b, t] (-100: not predicted)
  Tensor doc_start = Tensor();  // i32 [B, T] for rows of packed documents (data/packing.h); undefined otherwise
  // Preference pairs (DPO, data/packing.h): per target, 2p / 2p + 1 when it belongs to the chosen / rejected
  // response of the batch's pair p, -1 elsewhere; whether it counts in the DPO log-prob (i32 [B, T] both);
  // the reference model's log-probs of the pairs' responses, f64 [2P].
  Tensor response = Tensor(), counted = Tensor(), reference_logp = Tensor();
  // What this micro-batch's loss is a mean over (its labelled tokens, its pairs): a step weighs its
  // micro-batches by it, so the step's loss is the mean over all of them. -1: they weigh the same.
  int64_t loss_units = -1;
};

struct SamplerCursor {
  uint64_t epoch = 0;
  uint64_t position = 0;  // windows of this epoch already handed out
  bool operator==(const SamplerCursor&) const = default;
};

class BatchSampler {
 public:
  // tokens: a 1-D i32 tensor on the CPU holding at least seq_len + 1 tokens; it is shared, not copied.
  BatchSampler(Tensor tokens, int64_t batch_size, int64_t seq_len, uint64_t seed, int rank = 0, int world_size = 1);

  TokenBatch next();
  SamplerCursor cursor() const { return cursor_; }
  // Fails when the position lies beyond the windows of that epoch (a cursor from another setup).
  void restore(const SamplerCursor& cursor);
  int64_t windows_in_epoch() const { return static_cast<int64_t>(window_starts_.size()); }

 private:
  void enter_epoch(uint64_t epoch);

  Tensor tokens_;
  int64_t batch_size_;
  int64_t seq_len_;
  uint64_t seed_;
  int rank_;
  int world_size_;
  SamplerCursor cursor_;
  std::vector<int64_t> window_starts_;  // of cursor_.epoch, in visiting order
};

// Held-out evaluation: windows at 0, T, 2T, ... in order, every one exactly once, B per batch (the last
// batch may have fewer rows). Deterministic by construction; reset() starts over.
class HeldoutBatches {
 public:
  HeldoutBatches(Tensor tokens, int64_t batch_size, int64_t seq_len);

  std::optional<TokenBatch> next();  // nullopt after the last window
  void reset() { next_window_ = 0; }
  int64_t num_windows() const { return num_windows_; }

 private:
  Tensor tokens_;
  int64_t batch_size_;
  int64_t seq_len_;
  int64_t num_windows_;
  int64_t next_window_ = 0;
};

}  // namespace lt
