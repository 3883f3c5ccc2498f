#include "data/packing.h"

#include <map>

#include "tensor/derive_seed.h"
#include "tensor/error.h"
#include "tensor/random.h"

namespace lt {

namespace {

// The row order's stream of the stage's seed (BatchSampler's windows use another).
constexpr uint64_t kRowSamplerStream = 0x726f7773;

// A row being filled: its tokens (at most T + 1), and per token its mask, DPO mask, the row position
// where its sequence starts and the index of its sequence.
struct OpenRow {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> masks, counted;
  std::vector<int32_t> starts, owners;
  int64_t sequences = 0;
};

// Completes a row: its tokens become inputs and targets; the positions past them are padding.
PackedRow finish_row(const OpenRow& open, int64_t T, uint32_t pad_id) {
  PackedRow row;
  row.sequences = open.sequences;
  row.inputs.assign(static_cast<size_t>(T), static_cast<int32_t>(pad_id));
  row.targets.assign(static_cast<size_t>(T), -100);
  row.doc_start.assign(static_cast<size_t>(T), 0);
  row.sequence.assign(static_cast<size_t>(T), -1);
  row.counted.assign(static_cast<size_t>(T), 0);
  const auto used = static_cast<int64_t>(open.tokens.size());
  for (int64_t t = 0; t < T; ++t) {
    const auto i = static_cast<size_t>(t);
    if (t < used) {
      row.inputs[i] = static_cast<int32_t>(open.tokens[i]);
      row.doc_start[i] = open.starts[i];
    } else {
      row.doc_start[i] = static_cast<int32_t>(used);  // the padding is one document, from `used` on
    }
    if (t + 1 < used && open.masks[i + 1]) {
      row.targets[i] = static_cast<int32_t>(open.tokens[i + 1]);
      row.sequence[i] = open.owners[i + 1];
      row.counted[i] = open.counted[i + 1];
      ++row.labelled;
    }
  }
  return row;
}

}  // namespace

std::vector<PackedRow> pack_sequences(const std::vector<LabeledSequence>& sequences, int64_t T, uint32_t pad_id,
                                      int64_t group) {
  LT_CHECK(T > 0, "packing: the row length must be positive, got ", T);
  LT_CHECK(group >= 1 && sequences.size() % static_cast<size_t>(group) == 0, "packing: ", sequences.size(),
           " sequences do not make groups of ", group);
  std::vector<PackedRow> rows;
  OpenRow open;
  for (size_t first = 0; first < sequences.size(); first += static_cast<size_t>(group)) {
    int64_t length = 0;
    for (size_t n = first; n < first + static_cast<size_t>(group); ++n) {
      const LabeledSequence& s = sequences[n];
      LT_CHECK(s.loss_mask.size() == s.ids.size() && (s.dpo_mask.empty() || s.dpo_mask.size() == s.ids.size()),
               "packing: sequence ", n, " has ", s.ids.size(), " ids but ", s.loss_mask.size(), " mask entries");
      LT_CHECK(s.ids.size() >= 2 && s.loss_mask[0] == 0, "packing: sequence ", n,
               " needs at least 2 tokens and an unpredicted first one");
      length += static_cast<int64_t>(s.ids.size());
    }
    if (group == 1)
      LT_CHECK(length <= T + 1, "packing: sequence ", first, " has ", length, " tokens; a row of ", T,
               " positions takes 2 to ", T + 1);
    else
      LT_CHECK(length <= T + 1, "packing: sequences ", first, " to ", first + static_cast<size_t>(group) - 1, " have ",
               length, " tokens together; a row of ", T, " positions takes at most ", T + 1);
    if (static_cast<int64_t>(open.tokens.size()) + length > T + 1) {
      rows.push_back(finish_row(open, T, pad_id));
      open = OpenRow();
    }
    for (size_t n = first; n < first + static_cast<size_t>(group); ++n) {
      const LabeledSequence& s = sequences[n];
      const auto start = static_cast<int32_t>(open.tokens.size());
      open.tokens.insert(open.tokens.end(), s.ids.begin(), s.ids.end());
      open.masks.insert(open.masks.end(), s.loss_mask.begin(), s.loss_mask.end());
      const std::vector<uint8_t>& counted = s.dpo_mask.empty() ? s.loss_mask : s.dpo_mask;
      open.counted.insert(open.counted.end(), counted.begin(), counted.end());
      open.starts.insert(open.starts.end(), s.ids.size(), start);
      open.owners.insert(open.owners.end(), s.ids.size(), static_cast<int32_t>(n));
      ++open.sequences;
    }
  }
  if (open.sequences > 0) rows.push_back(finish_row(open, T, pad_id));
  return rows;
}

std::vector<size_t> row_range(size_t first, size_t count) {
  std::vector<size_t> picked(count);
  for (size_t i = 0; i < count; ++i) picked[i] = first + i;
  return picked;
}

TokenBatch stack_rows(const std::vector<PackedRow>& rows, const std::vector<size_t>& picked) {
  LT_CHECK(!picked.empty(), "packing: a batch needs at least one row");
  for (size_t r : picked) LT_CHECK(r < rows.size(), "packing: row ", r, " is not within the ", rows.size(), " rows");
  const auto T = static_cast<int64_t>(rows[picked[0]].inputs.size());
  std::vector<int32_t> inputs, targets, starts;
  int64_t labelled = 0;
  for (size_t r : picked) {
    inputs.insert(inputs.end(), rows[r].inputs.begin(), rows[r].inputs.end());
    targets.insert(targets.end(), rows[r].targets.begin(), rows[r].targets.end());
    starts.insert(starts.end(), rows[r].doc_start.begin(), rows[r].doc_start.end());
    labelled += rows[r].labelled;
  }
  const auto B = static_cast<int64_t>(picked.size());
  TokenBatch batch{Tensor::from_vector<int32_t>({B, T}, inputs), Tensor::from_vector<int32_t>({B, T}, targets),
                   Tensor::from_vector<int32_t>({B, T}, starts)};
  batch.loss_units = labelled;
  return batch;
}

TokenBatch stack_preference_rows(const std::vector<PackedRow>& rows, const std::vector<size_t>& picked,
                                 const std::vector<double>& reference_logp) {
  TokenBatch batch = stack_rows(rows, picked);
  std::vector<int32_t> response, counted;
  std::map<int32_t, int32_t> local_pair;  // global pair -> its number in this batch
  std::vector<double> reference;
  for (size_t r : picked)
    for (size_t t = 0; t < rows[r].sequence.size(); ++t) {
      const int32_t s = rows[r].sequence[t];
      counted.push_back(rows[r].counted[t]);
      if (s < 0) {
        response.push_back(-1);
        continue;
      }
      LT_CHECK(static_cast<size_t>(s / 2 * 2 + 1) < reference_logp.size(), "packing: no reference log-prob for sequence ", s);
      const auto [it, added] = local_pair.emplace(s / 2, static_cast<int32_t>(local_pair.size()));
      if (added) {
        reference.push_back(reference_logp[static_cast<size_t>(s / 2 * 2)]);
        reference.push_back(reference_logp[static_cast<size_t>(s / 2 * 2 + 1)]);
      }
      response.push_back(2 * it->second + s % 2);
    }
  batch.response = Tensor::from_vector<int32_t>(batch.targets.shape(), response);
  batch.counted = Tensor::from_vector<int32_t>(batch.targets.shape(), counted);
  batch.reference_logp = Tensor::from_vector<double>({static_cast<int64_t>(reference.size())}, reference);
  batch.loss_units = static_cast<int64_t>(local_pair.size());
  return batch;
}

RowSampler::RowSampler(int64_t rows, int64_t batch_size, uint64_t seed, int rank, int world_size)
    : rows_(rows), batch_size_(batch_size), seed_(seed), rank_(rank), world_size_(world_size) {
  LT_CHECK(batch_size > 0 && world_size >= 1 && rank >= 0 && rank < world_size, "row sampler: bad batch ", batch_size,
           " or rank ", rank, " of ", world_size);
  LT_CHECK(rows >= batch_size * world_size, "the data packs into ", rows, " rows, fewer than one batch (", batch_size,
           " rows x ", world_size, " ranks)");
  enter_epoch(0);
}

void RowSampler::enter_epoch(uint64_t epoch) {
  Rng rng(derive_seed(derive_seed(seed_, kRowSamplerStream), epoch));
  order_.resize(static_cast<size_t>(rows_));
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = i;
  // Fisher-Yates with our own Rng: std::shuffle's algorithm differs between standard libraries.
  for (int64_t i = rows_ - 1; i > 0; --i)
    std::swap(order_[static_cast<size_t>(i)], order_[static_cast<size_t>(rng.below(static_cast<uint64_t>(i) + 1))]);
  cursor_ = {epoch, 0};
}

std::vector<size_t> RowSampler::next() {
  const auto step_rows = static_cast<uint64_t>(batch_size_ * world_size_);
  if (cursor_.position + step_rows > order_.size()) enter_epoch(cursor_.epoch + 1);
  const auto first = static_cast<size_t>(cursor_.position) + static_cast<size_t>(rank_ * batch_size_);
  std::vector<size_t> picked(order_.begin() + static_cast<std::ptrdiff_t>(first),
                             order_.begin() + static_cast<std::ptrdiff_t>(first + static_cast<size_t>(batch_size_)));
  cursor_.position += step_rows;
  return picked;
}

void RowSampler::restore(const SamplerCursor& cursor) {
  enter_epoch(cursor.epoch);
  LT_CHECK(cursor.position <= order_.size(), "row sampler: cursor position ", cursor.position, " is beyond the ",
           order_.size(), " rows (was it saved with other data, seed or sequence length?)");
  cursor_ = cursor;
}

}  // namespace lt
