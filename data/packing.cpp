#include "data/packing.h"

#include "tensor/error.h"

namespace lt {

namespace {

// Completes a row being filled: `tokens` (at most T + 1) and their masks become inputs and targets;
// the positions past them are padding.
PackedRow finish_row(const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& masks,
                     const std::vector<int32_t>& starts, int64_t sequences, int64_t T, uint32_t pad_id) {
  PackedRow row;
  row.sequences = sequences;
  row.inputs.assign(static_cast<size_t>(T), static_cast<int32_t>(pad_id));
  row.targets.assign(static_cast<size_t>(T), -100);
  row.doc_start.assign(static_cast<size_t>(T), 0);
  const auto used = static_cast<int64_t>(tokens.size());
  for (int64_t t = 0; t < T; ++t) {
    const auto i = static_cast<size_t>(t);
    if (t < used) {
      row.inputs[i] = static_cast<int32_t>(tokens[i]);
      row.doc_start[i] = starts[i];
    } else {
      row.doc_start[i] = static_cast<int32_t>(used);  // the padding is one document, from `used` on
    }
    if (t + 1 < used && masks[i + 1]) {
      row.targets[i] = static_cast<int32_t>(tokens[i + 1]);
      ++row.labelled;
    }
  }
  return row;
}

}  // namespace

std::vector<PackedRow> pack_sequences(const std::vector<LabeledSequence>& sequences, int64_t T, uint32_t pad_id) {
  LT_CHECK(T > 0, "packing: the row length must be positive, got ", T);
  std::vector<PackedRow> rows;
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> masks;
  std::vector<int32_t> starts;
  int64_t in_row = 0;
  for (size_t n = 0; n < sequences.size(); ++n) {
    const LabeledSequence& s = sequences[n];
    const auto length = static_cast<int64_t>(s.ids.size());
    LT_CHECK(s.loss_mask.size() == s.ids.size(), "packing: sequence ", n, " has ", s.ids.size(), " ids and ",
             s.loss_mask.size(), " mask entries");
    LT_CHECK(length >= 2 && length <= T + 1, "packing: sequence ", n, " has ", length, " tokens; a row of ", T,
             " positions takes 2 to ", T + 1);
    if (static_cast<int64_t>(tokens.size()) + length > T + 1) {
      rows.push_back(finish_row(tokens, masks, starts, in_row, T, pad_id));
      tokens.clear();
      masks.clear();
      starts.clear();
      in_row = 0;
    }
    const auto start = static_cast<int32_t>(tokens.size());
    tokens.insert(tokens.end(), s.ids.begin(), s.ids.end());
    masks.insert(masks.end(), s.loss_mask.begin(), s.loss_mask.end());
    starts.insert(starts.end(), s.ids.size(), start);
    ++in_row;
  }
  if (in_row > 0) rows.push_back(finish_row(tokens, masks, starts, in_row, T, pad_id));
  return rows;
}

TokenBatch stack_rows(const std::vector<PackedRow>& rows, size_t first, size_t count) {
  LT_CHECK(count > 0 && first + count <= rows.size(), "packing: rows [", first, ", ", first + count,
           ") are not within the ", rows.size(), " rows");
  const auto T = static_cast<int64_t>(rows[first].inputs.size());
  std::vector<int32_t> inputs, targets, starts;
  for (size_t r = first; r < first + count; ++r) {
    inputs.insert(inputs.end(), rows[r].inputs.begin(), rows[r].inputs.end());
    targets.insert(targets.end(), rows[r].targets.begin(), rows[r].targets.end());
    starts.insert(starts.end(), rows[r].doc_start.begin(), rows[r].doc_start.end());
  }
  const auto B = static_cast<int64_t>(count);
  return {Tensor::from_vector<int32_t>({B, T}, inputs), Tensor::from_vector<int32_t>({B, T}, targets),
          Tensor::from_vector<int32_t>({B, T}, starts)};
}

}  // namespace lt
