// Multiple-choice items: the plain and HellaSwag forms (the harness's preprocessing), the errors that name
// file and line, few-shot prompts, the sequences that score a choice (eos, the moved whitespace, the
// truncation from the left), and the embedded task made from held-out corpus documents.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/corpus.h"
#include "data/corpus_multiple_choice.h"
#include "data/multiple_choice.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

MultipleChoiceItem item_of(const std::string& json_line) {
  return multiple_choice_item_from_json(parse_json(json_line, "test"), "items.jsonl:1");
}

TEST(MultipleChoice, PlainItemsKeepTheirTextAsGiven) {
  const MultipleChoiceItem item = item_of(R"({"context": "The cat ", "choices": ["sat", " ran"], "label": 1})");
  EXPECT_EQ(item.context, "The cat ");
  EXPECT_EQ(item.choices, (std::vector<std::string>{"sat", " ran"}));
  EXPECT_EQ(item.label, 1);
  EXPECT_EQ(item.delimiter, "");
  EXPECT_EQ(item.where, "items.jsonl:1");
}

TEST(MultipleChoice, HellaSwagIsPreprocessedAsTheHarnessDoes) {
  const MultipleChoiceItem item = item_of(
      R"({"activity_label": "Making tea", "ctx_a": "A man boils water [header] in a kettle.", "ctx_b": "tHen he",)"
      R"( "ctx": "unused", "endings": ["pours it [title] into a cup.", " sings  loudly. "], "label": "1"})");
  EXPECT_EQ(item.context, "Making tea: A man boils water in a kettle. Then he");
  EXPECT_EQ(item.choices, (std::vector<std::string>{"pours it. into a cup.", "sings loudly."}));
  EXPECT_EQ(item.label, 1);
  EXPECT_EQ(item.delimiter, " ");
  const MultipleChoiceItem bare = item_of(R"({"ctx": "  She opens [x] the door ", "endings": ["a", "b"], "label": 0})");
  EXPECT_EQ(bare.context, "She opens the door");
  EXPECT_EQ(hellaswag_preprocess("a [b\n] c [d] e"), "a [b\n] c e");
  EXPECT_EQ(hellaswag_preprocess("a   b"), "a  b");  // one pass of "  " -> " ", as Python's replace
  EXPECT_EQ(capitalize_ascii("hELLO wORLD"), "Hello world");
}

TEST(MultipleChoice, BadItemsNameFileAndLine) {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"context": "a", "choices": ["b", "c"]})", "no label"},
      {R"({"context": "a", "choices": ["b", "c"], "label": 2})", "label 2 is out of range for 2 choices"},
      {R"({"context": "a", "choices": ["b", "c"], "label": -1})", "label -1 is out of range"},
      {R"({"context": "a", "choices": ["b", ""], "label": 0})", "choice 1 is empty"},
      {R"({"ctx": "a", "endings": ["b", " [x] "], "label": 0})", "choice 1 is empty"},
      {R"({"context": "a", "label": 0})", "no choices"},
      {R"({"context": "a", "choices": [], "label": 0})", "no choices"},
      {R"({"context": "a", "choices": ["b", 3], "label": 0})", "array of strings"},
      {R"({"context": "a", "choices": ["b"], "label": "first"})", "key 'label'"},
      {R"({"choices": ["b"], "label": 0})", "missing key 'context'"},
      {"not json", "invalid JSON"},
  };
  for (const auto& [line, message] : cases) {
    const std::string path = dir.path("bad.jsonl");
    test::write_raw_file(path, R"({"context": "ok", "choices": ["x"], "label": 0})" "\n\n" + line + "\n");
    test::expect_error([&] { read_multiple_choice_file(path); }, {"bad.jsonl:3", message});
  }
}

TEST(MultipleChoice, LimitReadsTheFirstItems) {
  test::TempDir dir;
  const std::string path = dir.path("items.jsonl");
  test::write_raw_file(path, R"({"context": "a", "choices": ["x"], "label": 0})" "\n"
                             R"({"context": "b", "choices": ["y"], "label": 0})" "\n");
  EXPECT_EQ(read_multiple_choice_file(path, 1).size(), 1u);
  EXPECT_EQ(read_multiple_choice_file(path).size(), 2u);
}

TEST(MultipleChoice, CharactersAreCodePoints) {
  EXPECT_EQ(utf8_characters("abc"), 3);
  EXPECT_EQ(utf8_characters(" ämö"), 4);  // 6 bytes
}

TEST(MultipleChoice, FewShotExamplesAreDrawnBySeedAndNeverTheItemItself) {
  for (size_t item = 0; item < 20; ++item) {
    const std::vector<size_t> drawn = draw_few_shot_examples(6, 5, 7, item % 6, item % 6);
    EXPECT_EQ(std::set<size_t>(drawn.begin(), drawn.end()).size(), 5u);
    for (size_t e : drawn) EXPECT_NE(e, item % 6);
    EXPECT_EQ(drawn, draw_few_shot_examples(6, 5, 7, item % 6, item % 6));
  }
  EXPECT_NE(draw_few_shot_examples(1000, 3, 7, 0, std::nullopt), draw_few_shot_examples(1000, 3, 8, 0, std::nullopt));
  test::expect_error([] { draw_few_shot_examples(3, 3, 7, 0, 0); }, {"3 examples asked for", "holds 2 other items"});

  const MultipleChoiceItem solved{"Q1", {"a", "b"}, 1, " ", "x:1"}, other{"Q2", {"c"}, 0, "", "x:2"},
      item{"Q3", {"d"}, 0, "", "x:3"};
  EXPECT_EQ(few_shot_context(item, {&solved, &other}), "Q1 b\n\nQ2c\n\nQ3");
  EXPECT_EQ(few_shot_context(item, {}), "Q3");
}

TEST(MultipleChoice, SequencesStartWithEosAndLabelTheChoiceOnly) {
  const ByteTokenizer tokenizer;
  const MultipleChoiceItem item{"2 + 2 =  ", {"4", "22"}, 0, " ", "x:1"};
  const MultipleChoiceSequences sequences = multiple_choice_sequences(item, item.context, tokenizer, 100);
  ASSERT_EQ(sequences.choices.size(), 2u);
  EXPECT_FALSE(sequences.truncated);
  const LabeledSequence& s = sequences.choices[1];
  EXPECT_EQ(s.ids[0], tokenizer.eos_id());
  std::vector<uint32_t> labelled;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (s.loss_mask[i]) labelled.push_back(s.ids[i]);
  // The context's trailing spaces move in front of the continuation (delimiter + choice), as the harness's
  // requests do.
  EXPECT_EQ(tokenizer.decode(labelled), "   22");
  EXPECT_EQ(tokenizer.decode(std::vector<uint32_t>(s.ids.begin() + 1, s.ids.end())), "2 + 2 =   22");

  const MultipleChoiceSequences cut = multiple_choice_sequences(item, item.context, tokenizer, 6);
  EXPECT_TRUE(cut.truncated);
  EXPECT_EQ(tokenizer.decode(cut.choices[1].ids), "=   22");
  EXPECT_EQ(cut.choices[1].loss_mask, (std::vector<uint8_t>{0, 1, 1, 1, 1, 1}));
  test::expect_error([&] { multiple_choice_sequences(item, item.context, tokenizer, 5); },
                     {"x:1", "choice 1 has 5 tokens"});
}

TEST(CorpusMultipleChoice, ItemsContinueHeldOutDocuments) {
  const std::vector<MultipleChoiceItem> items = make_corpus_multiple_choice_items(3, 40);
  ASSERT_EQ(items.size(), 40u);
  EXPECT_EQ(items[7].context, make_corpus_multiple_choice_items(3, 8)[7].context);  // a function of the seed
  const std::vector<MultipleChoiceItem> other_seed = make_corpus_multiple_choice_items(4, 40);
  int same_choices = 0;
  for (size_t i = 0; i < items.size(); ++i) same_choices += items[i].choices == other_seed[i].choices;
  EXPECT_LT(same_choices, 4);

  // The held-out documents in index order, to find each item's own.
  std::vector<std::string> heldout;
  for (uint64_t index = 0; heldout.size() < 200; ++index)
    if (is_heldout_document(kDefaultCorpusSeed, index, kDefaultHeldoutFraction))
      heldout.push_back(generate_corpus_document(kDefaultCorpusSeed, index).text);
  std::vector<int> label_counts(4, 0);
  for (const MultipleChoiceItem& item : items) {
    ASSERT_EQ(item.choices.size(), 4u);
    ++label_counts[static_cast<size_t>(item.label)];
    const std::string answer = item.context + item.choices[static_cast<size_t>(item.label)];
    const auto continues = [&](const std::string& document) { return document.starts_with(answer); };
    EXPECT_TRUE(std::any_of(heldout.begin(), heldout.end(), continues)) << item.where;
    EXPECT_GE(item.context.size(), 96u);
    EXPECT_LE(1 + item.context.size() + kCorpusChoiceBytes, 257u);  // the tiny preset's 256 positions
    for (const std::string& choice : item.choices) {
      EXPECT_TRUE(choice[0] == ' ' || choice[0] == '\n' || choice[0] == '\t') << item.where;
      EXPECT_GE(choice.size(), kCorpusChoiceBytes - 3);
      EXPECT_LE(choice.size(), kCorpusChoiceBytes);
    }
    EXPECT_EQ(std::set<std::string>(item.choices.begin(), item.choices.end()).size(), 4u) << item.where;
  }
  for (int count : label_counts) EXPECT_GT(count, 3);
}

}  // namespace
}  // namespace lt
