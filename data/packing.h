// Packing labelled sequences (chat-template output: ids and a loss mask) into training rows of T
// positions, several per row, for SFT and DPO.
//
// A row holds whole sequences back to back, at most T + 1 tokens: inputs are its first T tokens and
// targets the next T, a target being -100 wherever the predicted token's mask is 0 (so a sequence's
// first token, a role marker, is never predicted from the sequence before it). doc_start gives each
// input position the row position where its sequence begins, for the attention document mask
// (kernels::attention): a sequence never sees another. The rest of a row is padding (pad_id, targets
// -100, a document of its own). Sequences are placed in order, each into the current row when it fits
// and into a new row otherwise (order kept: the packing is deterministic and resumable by position).
// For DPO the sequences come in groups (a pair's chosen and rejected responses, each after the prompt)
// that always share a row, so a batch holds whole pairs (Ling packs DPO pairs the same way).
#pragma once
#include <cstdint>
#include <vector>

#include "data/batch_sampler.h"
#include "tensor/tensor.h"

namespace lt {

struct LabeledSequence {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> loss_mask;  // one per id; the first is 0 (nothing in the sequence predicts it)
  // DPO: which labelled tokens count in the DPO log-prob (format-recovery DPO counts those that differ
  // in format); empty: all of them.
  std::vector<uint8_t> dpo_mask = {};
};

struct PackedRow {
  std::vector<int32_t> inputs, targets, doc_start;  // T each
  std::vector<int32_t> sequence;  // T: the index of the sequence a counted target belongs to, -1 elsewhere
  std::vector<int32_t> counted;   // T: 1 where a target counts in the DPO log-prob
  int64_t sequences = 0;
  int64_t labelled = 0;  // targets that count
};

// Sequences [g group, (g + 1) group) share a row. Fails unless every group fits in T + 1 tokens, every
// sequence has at least 2 tokens, a mask entry per id and a first mask entry of 0.
std::vector<PackedRow> pack_sequences(const std::vector<LabeledSequence>& sequences, int64_t T, uint32_t pad_id,
                                      int64_t group = 1);

// The indices first, first + 1, ..., first + count - 1: a run of consecutive rows to stack.
std::vector<size_t> row_range(size_t first, size_t count);

// The rows at `picked` as one batch of i32 tensors [picked.size(), T]; loss_units = their labelled targets.
TokenBatch stack_rows(const std::vector<PackedRow>& rows, const std::vector<size_t>& picked);
// The same for rows packed from pairs (group 2: sequence 2q is pair q's chosen response, 2q + 1 its
// rejected one), with the DPO fields: the pairs numbered in the order they appear, and
// reference_logp[s] the reference's log-prob of sequence s. loss_units = the pairs.
TokenBatch stack_preference_rows(const std::vector<PackedRow>& rows, const std::vector<size_t>& picked,
                                 const std::vector<double>& reference_logp);

// Batches of packed rows for training: each epoch visits every row once in an order drawn from (seed,
// epoch), world_size * B rows per micro-batch of which rank r takes [r B, (r + 1) B); an epoch's last
// rows that cannot fill a micro-batch wait for a later epoch's order. The cursor (epoch, position) is
// the whole state, as for BatchSampler (data/batch_sampler.h).
class RowSampler {
 public:
  RowSampler(int64_t rows, int64_t batch_size, uint64_t seed, int rank = 0, int world_size = 1);
  std::vector<size_t> next();  // this rank's B row indices
  SamplerCursor cursor() const { return cursor_; }
  void restore(const SamplerCursor& cursor);

 private:
  void enter_epoch(uint64_t epoch);
  int64_t rows_, batch_size_;
  uint64_t seed_;
  int rank_, world_size_;
  SamplerCursor cursor_;
  std::vector<size_t> order_;
};

}  // namespace lt
