#include <gtest/gtest.h>

#include "data/tokenizer.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

TEST(Tokenizer, ByteTokenizerRoundTripsEveryByte) {
  const ByteTokenizer tokenizer;
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  const std::vector<uint32_t> ids = tokenizer.encode(all_bytes);
  ASSERT_EQ(ids.size(), 256u);
  for (uint32_t b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tokenizer.decode(ids), all_bytes);

  const std::string utf8 = "Päivää, 世界! 12 + 35 = 47";
  EXPECT_EQ(tokenizer.encode(utf8).size(), utf8.size());
  EXPECT_EQ(tokenizer.decode(tokenizer.encode(utf8)), utf8);
}

TEST(Tokenizer, SpecialTokensAfterTheBytes) {
  const ByteTokenizer tokenizer;
  EXPECT_EQ(tokenizer.vocab_size(), 259);
  EXPECT_EQ(tokenizer.eos_id(), 256u);
  EXPECT_EQ(tokenizer.pad_id(), 256u);
  EXPECT_EQ(tokenizer.special_token_id("<|endoftext|>"), 256u);
  EXPECT_EQ(tokenizer.special_token_id("<role>"), 257u);
  EXPECT_EQ(tokenizer.special_token_id("</role>"), 258u);
  EXPECT_EQ(tokenizer.special_token_id("<|im_end|>"), std::nullopt);
}

TEST(Tokenizer, PlainEncodeNeverMakesSpecialTokens) {
  const ByteTokenizer tokenizer;
  const std::string text = "a<|endoftext|>b";
  EXPECT_EQ(tokenizer.encode(text).size(), text.size());
  EXPECT_EQ(tokenizer.encode_with_special_tokens(text), (std::vector<uint32_t>{'a', 256, 'b'}));
}

TEST(Tokenizer, ChatMarkersEncodeAndDecode) {
  const ByteTokenizer tokenizer;
  const std::string chat = "<role>HUMAN</role>Hi<role>ASSISTANT</role>Hello<|endoftext|>";
  const std::vector<uint32_t> ids = tokenizer.encode_with_special_tokens(chat);
  EXPECT_EQ(ids.front(), ByteTokenizer::kRoleOpen);
  EXPECT_EQ(ids[6], ByteTokenizer::kRoleClose);
  EXPECT_EQ(ids.back(), ByteTokenizer::kEndOfText);
  // Two <role> (6 bytes each), two </role> (7 bytes) and one <|endoftext|> (13 bytes) become one id each.
  EXPECT_EQ(ids.size(), chat.size() - (5 + 5 + 6 + 6 + 12));
  EXPECT_EQ(tokenizer.decode(ids), chat);
  EXPECT_EQ(tokenizer.encode_with_special_tokens("<rol"), (std::vector<uint32_t>{'<', 'r', 'o', 'l'}));
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const ByteTokenizer tokenizer;
  test::expect_error([&] { tokenizer.decode(std::vector<uint32_t>{65, 259}); },
                     {"token id 259 is outside the vocabulary of 259"});
}

TEST(Tokenizer, DocumentsEnterTheStreamAfterAnEos) {
  const ByteTokenizer tokenizer;
  std::vector<uint32_t> stream;
  append_document_tokens(stream, "ab", tokenizer);
  append_document_tokens(stream, "", tokenizer);
  append_document_tokens(stream, "c", tokenizer);
  EXPECT_EQ(stream, (std::vector<uint32_t>{256, 'a', 'b', 256, 256, 'c'}));
}

}  // namespace
}  // namespace lt
