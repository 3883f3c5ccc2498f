// Byte-level BPE: ids equal to Hugging Face's (goldens from tokenizers.js, made by
// tests/reference/tokenizers/make_goldens.sh), the BPE trainer, round trips of any bytes, and one clear
// error for each kind of tokenizer.json that is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/bpe_trainer.h"
#include "data/regex.h"
#include "io/json.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

const std::string kGoldenDir = std::string(LINGTRAIN_SOURCE_DIR) + "/tests/golden/tokenizers/";

TEST(BpeTokenizer, MatchesHuggingFaceIdForId) {
  const Json goldens = read_json_file(kGoldenDir + "goldens.json");
  const std::vector<std::string> texts = goldens.at("texts").get<std::vector<std::string>>();
  ASSERT_GE(goldens.at("tokenizers").size(), 6u);
  int64_t compared = 0;
  for (const auto& [name, expected] : goldens.at("tokenizers").items()) {
    const BpeTokenizer tokenizer = BpeTokenizer::from_file(kGoldenDir + name);
    const auto ids = expected.at("ids").get<std::vector<std::vector<uint32_t>>>();
    const auto decoded = expected.at("decoded").get<std::vector<std::string>>();
    ASSERT_EQ(ids.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      SCOPED_TRACE(name + ": \"" + texts[i] + "\"");
      EXPECT_EQ(tokenizer.encode_with_special_tokens(texts[i]), ids[i]);
      EXPECT_EQ(tokenizer.decode(ids[i]), decoded[i]);
      compared += static_cast<int64_t>(ids[i].size());
    }
  }
  EXPECT_GT(compared, 3000);  // the goldens are not trivially short
}

TEST(BpeTokenizer, PlainEncodeCutsOnlyAddedTokensThatAreNotSpecial) {
  const BpeTokenizer tokenizer = BpeTokenizer::from_file(kGoldenDir + "ling_added_tokens.json");
  const uint32_t eos = tokenizer.eos_id();
  const uint32_t plain_added = *tokenizer.special_token_id("lingtrain");
  const std::vector<uint32_t> plain = tokenizer.encode("a<|endoftext|>b lingtrain");
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eos), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), plain_added), 1);
  EXPECT_EQ(tokenizer.decode(plain), "a<|endoftext|>b lingtrain");
  const std::vector<uint32_t> special = tokenizer.encode_with_special_tokens("a<|endoftext|>b");
  EXPECT_EQ(std::count(special.begin(), special.end(), eos), 1);
}

TEST(BpeTokenizer, AnyBytesRoundTrip) {
  const BpeTokenizer tokenizer = BpeTokenizer::from_file(kGoldenDir + "llama3.json");
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(static_cast<char>(b));
  for (const std::string& text : {every_byte, std::string("\xff\xfe invalid \xc3 UTF-8 \xe2\x82"), std::string(5000, ' '),
                                  std::string("x") + std::string(3000, 'a')})
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(text)), text);
}

TEST(BpeTrainer, DeterministicFullAndLoadable) {
  const std::string text =
      "the cat sat on the mat. the cat ate the rat. 12345 + 678 = 13023\n"
      "Ünïcödé wörds and ÜNÏCÖDÉ WÖRDS; the cat's hat, the rat's mat\n";
  std::vector<std::string_view> texts(20, text);
  BpeTrainSettings settings;
  settings.vocab_size = 300;
  const Json first = train_bpe(texts, settings);
  EXPECT_EQ(train_bpe(texts, settings), first);
  const BpeTokenizer tokenizer = BpeTokenizer::from_json(first, "trained");
  EXPECT_EQ(tokenizer.vocab_size(), 300);
  EXPECT_EQ(first.at("model").at("merges").size(), 300u - 256 - 3);
  EXPECT_EQ(tokenizer.eos_id(), 297u);  // after the bytes and the merges, the special tokens
  EXPECT_EQ(*tokenizer.special_token_id("<role>"), 298u);
  // Merges pay: far fewer tokens than bytes on the training text, and an exact round trip.
  const std::vector<uint32_t> ids = tokenizer.encode(text);
  EXPECT_LT(ids.size() * 2, text.size());
  EXPECT_EQ(tokenizer.decode(ids), text);
  // Each pattern trains; an unknown one and a vocabulary too small for the bytes are refused.
  for (const char* pattern : {"gpt2", "llama3"}) {
    settings.pattern = pattern;
    EXPECT_EQ(BpeTokenizer::from_json(train_bpe(texts, settings), pattern).vocab_size(), 300);
  }
  settings.pattern = "bert";
  test::expect_error([&] { train_bpe(texts, settings); }, {"pattern 'bert'", "gpt2, llama3, ling"});
  settings.pattern = "ling";
  settings.vocab_size = 200;
  test::expect_error([&] { train_bpe(texts, settings); }, {"--vocab 200", "256 bytes"});
}

TEST(BpeTokenizer, RefusesWhatItDoesNotImplementWithOneLine) {
  const Json base = read_json_file(kGoldenDir + "ling.json");
  struct Case {
    const char* name;
    std::function<void(Json&)> edit;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"WordPiece model", [](Json& j) { j["model"]["type"] = "WordPiece"; }, {"model type 'WordPiece'"}},
      {"a normalizer", [](Json& j) { j["normalizer"] = {{"type", "NFC"}}; }, {"normalizer", "NFC"}},
      {"byte fallback", [](Json& j) { j["model"]["byte_fallback"] = true; }, {"byte_fallback"}},
      {"subword prefix", [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, {"subword prefixes"}},
      {"whitespace pre-tokenizer", [](Json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; },
       {"pre_tokenizer type 'Whitespace'"}},
      {"no ByteLevel", [](Json& j) { j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][0]; }, {"no ByteLevel step"}},
      {"bad split behaviour", [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
       {"split behavior 'Sideways'"}},
      {"bad regex", [](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L}+"; },
       {"regular expression", "(\\p{L}+"}},
      {"merge of unknown tokens", [](Json& j) { j["model"]["merges"].push_back("\xc3\xa9\xc3\xa9 zz"); },
       {"names a token that is not in the vocabulary"}},
      {"malformed merge", [](Json& j) { j["model"]["merges"].push_back("nospace"); }, {"is not 'left right'"}},
      {"missing byte", [](Json& j) { j["model"]["vocab"].erase("a"); }, {"lacks the byte-level symbol of byte 97"}},
      {"not byte-level vocabulary", [](Json& j) { j["model"]["vocab"]["▁the"] = 5000; }, {"not made of byte-level"}},
      {"single_word", [](Json& j) { j["added_tokens"][0]["single_word"] = true; }, {"single_word is not supported"}},
      {"no end of text", [](Json& j) { j["added_tokens"][0]["content"] = "<eos>"; }, {"no end-of-text token"}},
      {"sparse ids", [](Json& j) { j["added_tokens"][0]["id"] = 2000000000; }, {"token ids are not dense"}},
      {"decoder", [](Json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder 'WordPiece'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Json edited = base;
    c.edit(edited);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back("bad.json: ");
    test::expect_error([&] { BpeTokenizer::from_json(edited, "bad.json"); }, fragments);
  }
}

TEST(Regex, MatchesUnicodePropertiesAndSkipsInvalidUtf8) {
  const Regex letters(R"(\p{L}+)");
  std::vector<std::string> found;
  const std::string text = "abc 日本 \xff\xfe déf";
  letters.for_each_match(text, [&](size_t begin, size_t end) { found.push_back(text.substr(begin, end - begin)); });
  EXPECT_EQ(found, (std::vector<std::string>{"abc", "日本", "déf"}));
  test::expect_error([] { Regex bad("a(b"); }, {"regular expression 'a(b'", "offset"});
}

}  // namespace
}  // namespace lt
