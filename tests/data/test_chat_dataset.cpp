// The post-training data sets: SFT conversations and DPO pairs rendered into labelled sequences, the
// prompt of a pair never labelled (an assistant turn in it included), format-only pairs counting just
// the tokens that differ, and the records that are skipped and counted rather than fatal.
#include <gtest/gtest.h>

#include "data/chat_dataset.h"
#include "data/chat_template.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

std::string labelled_text(const LabeledSequence& s, const Tokenizer& tokenizer, const std::vector<uint8_t>& mask) {
  std::vector<uint32_t> ids;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (mask[i]) ids.push_back(s.ids[i]);
  return tokenizer.decode(ids);
}

TEST(ChatDataset, ConversationsSkipAndCountTheTooLong) {
  test::TempDir dir;
  const std::string path = dir.path("sft.jsonl");
  test::write_raw_file(path, "{\"prompt\": \"hi\", \"completion\": \"hello\"}\n\n"
                             "{\"prompt\": \"" + std::string(300, 'x') + "\", \"completion\": \"long\"}\n");
  const ByteTokenizer tokenizer;
  const ChatDataset data = load_conversations(path, tokenizer, 64);
  EXPECT_EQ(data.records, 2);
  EXPECT_EQ(data.too_long, 1);
  ASSERT_EQ(data.sequences.size(), 1u);
  EXPECT_EQ(labelled_text(data.sequences[0], tokenizer, data.sequences[0].loss_mask), "hello<|endoftext|>");
}

TEST(ChatDataset, PairsLabelOnlyTheirResponses) {
  test::TempDir dir;
  const std::string path = dir.path("dpo.jsonl");
  // The prompt holds an earlier assistant turn: it must not be labelled in either response.
  test::write_raw_file(path,
                       R"({"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "call"},)"
                       R"( {"role": "observation", "content": "42"}], "chosen": "It is 42.", "rejected": "It is 7."})"
                       "\n"
                       R"({"prompt": "same", "chosen": "x", "rejected": "x"})"
                       "\n"
                       R"({"prompt": "f", "chosen": [{"role": "assistant", "content": "{\"a\": 1}"}],)"
                       R"( "rejected": [{"role": "assistant", "content": "{\"a\": 1"}], "format_only": true})"
                       "\n");
  const ByteTokenizer tokenizer;
  const ChatDataset data = load_preference_pairs(path, tokenizer, 1000);
  EXPECT_EQ(data.records, 3);
  EXPECT_EQ(data.identical, 1);
  EXPECT_EQ(data.format_only, 1);
  ASSERT_EQ(data.sequences.size(), 4u);
  EXPECT_EQ(labelled_text(data.sequences[0], tokenizer, data.sequences[0].loss_mask), "It is 42.<|endoftext|>");
  EXPECT_EQ(labelled_text(data.sequences[1], tokenizer, data.sequences[1].loss_mask), "It is 7.<|endoftext|>");
  EXPECT_TRUE(data.sequences[0].dpo_mask.empty());
  // Format-only: the common prefix {"a": 1 and the common suffix (none that leaves both a token) are
  // not counted; what differs is "}" + end for chosen, the end alone for rejected.
  EXPECT_EQ(labelled_text(data.sequences[2], tokenizer, data.sequences[2].dpo_mask), "}<|endoftext|>");
  EXPECT_EQ(labelled_text(data.sequences[3], tokenizer, data.sequences[3].dpo_mask), "<|endoftext|>");
  EXPECT_EQ(labelled_text(data.sequences[2], tokenizer, data.sequences[2].loss_mask), "{\"a\": 1}<|endoftext|>");
}

TEST(ChatDataset, MalformedRecordsNameFileAndLine) {
  test::TempDir dir;
  const std::string path = dir.path("bad.jsonl");
  const ByteTokenizer tokenizer;
  test::write_raw_file(path, "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n{\"prompt\": \"p\", \"chosen\": \"a\"}\n");
  test::expect_error([&] { load_preference_pairs(path, tokenizer, 100); },
                     {"bad.jsonl:2", "needs 'prompt', 'chosen' and 'rejected'"});
  test::write_raw_file(path, "{\"prompt\": \"p\", \"chosen\": \"\", \"rejected\": \"b\"}\n");
  test::expect_error([&] { load_preference_pairs(path, tokenizer, 100); }, {"bad.jsonl:1", "an empty assistant turn"});
  test::write_raw_file(path, "{\"prompt\": \"p\", \"completion\": \"a\"}\nnot json\n");
  test::expect_error([&] { load_conversations(path, tokenizer, 100); }, {"bad.jsonl:2"});
}

}  // namespace
}  // namespace lt
