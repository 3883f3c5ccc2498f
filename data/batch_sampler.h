// Batches of next-token windows over token shards (data/token_shards.h), from one source or a mixture
// of weighted sources.
//
// A window of T + 1 consecutive tokens of one shard gives one row: inputs are its first T tokens,
// targets its last T (the same tokens shifted by one). An epoch of a source visits its shards in a
// shuffled order and, within each, the windows that tile the shard at stride T from an offset (in
// [0, T)), all once, in a shuffled order. One generator per (seed, epoch) draws the shard order, each
// shard's offset, then each shard's window order as the epoch reaches it, so window boundaries move
// between epochs and the whole sequence of batches is a function of the seed (a single shard's stream
// is what a sampler over one token array always was). Only the current shard's window order is held.
//
// A mixture hands each window to the source whose share of the windows so far is furthest below its
// weight (ties to the first): every source's share of the tokens stays within one window of its weight
// at every point, and the interleaving needs no state beyond the counts. Source 0 draws its epochs from
// the seed itself, source i > 0 from a stream of it.
//
// The cursor (per source: epoch, position in that epoch, windows given in all) is all the state there
// is: saved in a checkpoint and restored into a sampler built with the same sources, seed, batch size,
// sequence length and world size, it continues with exactly the batches the original would have given.
//
// With world_size > 1, each step takes world_size * B windows and rank r keeps rows [r*B, (r+1)*B): the
// ranks see disjoint windows, share one cursor, and read only their own windows' tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/token_shards.h"
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
  uint64_t position = 0;  // windows (rows) of this epoch already handed out
  uint64_t given = 0;     // windows (rows) handed out over all epochs
  bool operator==(const SamplerCursor&) const = default;
};

// Where a stage's data stands: one cursor per source. Empty, or all zero: at the start.
using DataCursor = std::vector<SamplerCursor>;
bool at_start(const DataCursor& cursor);

// One source of windows: its shards and its weight in a mixture.
struct SamplerSource {
  std::string name;
  TokenShards tokens;
  double weight = 1;
};

class BatchSampler {
 public:
  BatchSampler(std::vector<SamplerSource> sources, int64_t batch_size, int64_t seq_len, uint64_t seed, int rank = 0,
               int world_size = 1);
  // One in-memory source: a 1-D i32 CPU tensor of at least seq_len + 1 tokens (shared, not copied).
  BatchSampler(Tensor tokens, int64_t batch_size, int64_t seq_len, uint64_t seed, int rank = 0, int world_size = 1);
  ~BatchSampler();
  BatchSampler(BatchSampler&&) noexcept;

  TokenBatch next();
  DataCursor cursor() const;
  // Fails when the cursor cannot belong to these sources (another count of sources, a position beyond
  // its epoch's windows: saved with other data, seed or sequence length).
  void restore(const DataCursor& cursor);

  size_t num_sources() const { return sources_.size(); }
  const SamplerSource& source(size_t i) const;
  int64_t windows_in_epoch(size_t source = 0) const;  // of the source's current epoch
  // How many more windows the sampler hands out before a source has to start another epoch, and which
  // source that is (its name).
  struct Exhaustion {
    int64_t windows = 0;
    std::string source;
  };
  Exhaustion first_exhaustion() const;

 private:
  class SourceWindows;
  size_t pick_source(const std::vector<uint64_t>& given) const;

  std::vector<std::unique_ptr<SourceWindows>> sources_;
  std::vector<double> shares_;  // the weights, summing to 1
  int64_t batch_size_;
  int64_t seq_len_;
  int rank_;
  int world_size_;
};

// Held-out evaluation: windows at 0, T, 2T, ... of the shards end to end, in order, every one exactly
// once, B per batch (the last batch may have fewer rows). Deterministic by construction; reset() starts
// over. limit_tokens > 0: only the windows within the first limit_tokens tokens.
class HeldoutBatches {
 public:
  HeldoutBatches(TokenShards tokens, int64_t batch_size, int64_t seq_len, int64_t limit_tokens = 0);

  std::optional<TokenBatch> next();  // nullopt after the last window
  void reset() { next_window_ = 0; }
  int64_t num_windows() const { return num_windows_; }

 private:
  TokenShards tokens_;
  int64_t batch_size_;
  int64_t seq_len_;
  int64_t num_windows_;
  int64_t next_window_ = 0;
};

}  // namespace lt
