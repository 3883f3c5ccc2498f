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
#pragma once
#include <cstdint>
#include <vector>

#include "data/batch_sampler.h"
#include "tensor/tensor.h"

namespace lt {

struct LabeledSequence {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> loss_mask;  // one per id
};

struct PackedRow {
  std::vector<int32_t> inputs, targets, doc_start;  // T each
  int64_t sequences = 0;
  int64_t labelled = 0;  // targets that count
};

// Fails unless every sequence has 2 to T + 1 tokens and a mask entry per id.
std::vector<PackedRow> pack_sequences(const std::vector<LabeledSequence>& sequences, int64_t T, uint32_t pad_id);

// Rows [first, first + count) as one batch of i32 tensors [count, T].
TokenBatch stack_rows(const std::vector<PackedRow>& rows, size_t first, size_t count);

}  // namespace lt
