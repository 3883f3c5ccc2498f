// Packing chat sequences into rows: whole sequences in order, targets only where the predicted token
// is labelled, doc_start marking each sequence (and the padding) as a document of its own.
#include <gtest/gtest.h>

#include <algorithm>

#include "data/packing.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

LabeledSequence sequence(uint32_t first_id, int64_t length, int64_t labelled_from) {
  LabeledSequence s;
  for (int64_t i = 0; i < length; ++i) {
    s.ids.push_back(first_id + static_cast<uint32_t>(i));
    s.loss_mask.push_back(i >= labelled_from ? 1 : 0);
  }
  return s;
}

TEST(Packing, SequencesFillRowsInOrderWithTheirOwnDocuments) {
  // Lengths 4, 3, 5 and 2 into rows of T = 7 (8 tokens each): [4 + 3], [5 + 2].
  const std::vector<LabeledSequence> seqs = {sequence(10, 4, 2), sequence(20, 3, 1), sequence(30, 5, 3),
                                             sequence(40, 2, 1)};
  const std::vector<PackedRow> rows = pack_sequences(seqs, 7, 0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].sequences, 2);
  EXPECT_EQ(rows[0].inputs, (std::vector<int32_t>{10, 11, 12, 13, 20, 21, 22}));
  // Predicted tokens: 12, 13 (labelled from index 2), 21, 22; 20 starts a sequence and is not predicted.
  EXPECT_EQ(rows[0].targets, (std::vector<int32_t>{-100, 12, 13, -100, 21, 22, -100}));
  EXPECT_EQ(rows[0].doc_start, (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4}));
  EXPECT_EQ(rows[0].labelled, 4);
  EXPECT_EQ(rows[1].inputs, (std::vector<int32_t>{30, 31, 32, 33, 34, 40, 41}));
  EXPECT_EQ(rows[1].targets, (std::vector<int32_t>{-100, -100, 33, 34, -100, 41, -100}));
  EXPECT_EQ(rows[1].doc_start, (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5}));

  // A row with room left is padded; the padding is a document of its own and predicts nothing.
  const std::vector<PackedRow> padded = pack_sequences({sequence(50, 3, 1)}, 6, 99);
  ASSERT_EQ(padded.size(), 1u);
  EXPECT_EQ(padded[0].inputs, (std::vector<int32_t>{50, 51, 52, 99, 99, 99}));
  EXPECT_EQ(padded[0].targets, (std::vector<int32_t>{51, 52, -100, -100, -100, -100}));
  EXPECT_EQ(padded[0].doc_start, (std::vector<int32_t>{0, 0, 0, 3, 3, 3}));

  const TokenBatch batch = stack_rows(rows, {0, 1});
  EXPECT_EQ(batch.loss_units, rows[0].labelled + rows[1].labelled);
  EXPECT_EQ(batch.inputs.shape(), (Shape{2, 7}));
  EXPECT_EQ(batch.targets.to_vector<int32_t>()[8], -100);
  EXPECT_EQ(batch.doc_start.to_vector<int32_t>()[12], 5);
}

TEST(Packing, RefusesSequencesThatDoNotFit) {
  test::expect_error([] { pack_sequences({sequence(1, 9, 1)}, 7, 0); }, {"sequence 0 has 9 tokens", "2 to 8"});
  test::expect_error([] { pack_sequences({sequence(1, 1, 0)}, 7, 0); }, {"sequence 0 needs at least 2 tokens"});
  LabeledSequence bad = sequence(1, 3, 1);
  bad.loss_mask.pop_back();
  test::expect_error([&] { pack_sequences({bad}, 7, 0); }, {"3 ids but 2 mask entries"});
  test::expect_error([] { stack_rows({}, {0}); }, {"row 0 is not within the 0 rows"});
  LabeledSequence predicted_first = sequence(1, 3, 0);
  test::expect_error([&] { pack_sequences({predicted_first}, 7, 0); }, {"unpredicted first one"});
  // A pair must fit in one row together.
  test::expect_error([] { pack_sequences({sequence(1, 5, 1), sequence(1, 4, 1)}, 7, 0, 2); },
                     {"sequences 0 to 1 have 9 tokens together"});
}

// DPO rows: a pair's two responses share a row; the batch numbers its pairs in order of appearance
// and carries their reference log-probs; format-recovery pairs count only the marked tokens.
TEST(Packing, PairsStayTogetherAndCarryTheirResponses) {
  LabeledSequence chosen0 = sequence(10, 4, 2), rejected0 = sequence(20, 3, 2);
  LabeledSequence chosen1 = sequence(30, 3, 1), rejected1 = sequence(40, 3, 1);
  rejected1.dpo_mask = {0, 0, 1};
  // Rows of T = 8 (9 tokens): pair 0 (7 tokens), then pair 1 (6) does not fit and opens a row.
  const std::vector<PackedRow> rows = pack_sequences({chosen0, rejected0, chosen1, rejected1}, 8, 0, 2);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].sequence, (std::vector<int32_t>{-1, 0, 0, -1, -1, 1, -1, -1}));
  EXPECT_EQ(rows[1].sequence, (std::vector<int32_t>{2, 2, -1, 3, 3, -1, -1, -1}));
  EXPECT_EQ(rows[1].counted, (std::vector<int32_t>{1, 1, 0, 0, 1, 0, 0, 0}));
  const std::vector<double> reference = {-1, -2, -3, -4};
  const TokenBatch batch = stack_preference_rows(rows, {1, 0}, reference);
  EXPECT_EQ(batch.loss_units, 2);
  EXPECT_EQ(batch.reference_logp.to_vector<double>(), (std::vector<double>{-3, -4, -1, -2}));
  const std::vector<int32_t> response = batch.response.to_vector<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(response.begin(), response.begin() + 8),
            (std::vector<int32_t>{0, 0, -1, 1, 1, -1, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(response.begin() + 8, response.end()),
            (std::vector<int32_t>{-1, 2, 2, -1, -1, 3, -1, -1}));
}

// Every row once per epoch, the ranks' rows disjoint, and a restored cursor continues identically.
TEST(Packing, RowSamplerVisitsEveryRowOncePerEpochAndResumes) {
  std::vector<int> seen(10, 0);
  RowSampler rank0(10, 2, 7, 0, 2), rank1(10, 2, 7, 1, 2);
  for (int step = 0; step < 2; ++step) {
    for (size_t r : rank0.next()) ++seen[r];
    for (size_t r : rank1.next()) ++seen[r];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 8);  // 2 rows wait: 10 is not a multiple of 4
  RowSampler again(10, 2, 7, 0, 2);
  again.restore(rank0.cursor());
  EXPECT_EQ(again.next(), rank0.next());
  EXPECT_EQ(rank0.cursor().epoch, 1u);
  test::expect_error([] { RowSampler(3, 2, 1, 0, 2); }, {"3 rows, fewer than one batch"});
}

}  // namespace
}  // namespace lt
