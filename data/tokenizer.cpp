#include "data/tokenizer.h"

#include <array>

#include "data/bpe_tokenizer.h"

#include "tensor/error.h"

namespace lt {

namespace {

struct SpecialToken {
  uint32_t id;
  std::string_view spelling;
};

constexpr std::array<SpecialToken, 3> kByteSpecialTokens{{
    {ByteTokenizer::kEndOfText, "<|endoftext|>"},
    {ByteTokenizer::kRoleOpen, "<role>"},
    {ByteTokenizer::kRoleClose, "</role>"},
}};
static_assert(kByteSpecialTokens[0].id == 256 && kByteSpecialTokens[1].id == 257 && kByteSpecialTokens[2].id == 258 &&
                  ByteTokenizer::kVocabSize == 256 + kByteSpecialTokens.size(),
              "special tokens follow the bytes in id order: decode finds them at id - 256");

}  // namespace

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::vector<uint32_t> ByteTokenizer::encode_with_special_tokens(std::string_view text) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const SpecialToken* matched = nullptr;
    if (text[i] == '<') {
      for (const SpecialToken& special : kByteSpecialTokens)
        if (text.substr(i).starts_with(special.spelling)) matched = &special;
    }
    if (matched) {
      ids.push_back(matched->id);
      i += matched->spelling.size();
    } else {
      ids.push_back(static_cast<unsigned char>(text[i]));
      ++i;
    }
  }
  return ids;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (uint32_t id : ids) {
    if (id < 256) {
      text.push_back(static_cast<char>(id));
      continue;
    }
    if (id >= kVocabSize) fail("byte tokenizer: token id ", id, " is outside the vocabulary of ", kVocabSize);
    text += kByteSpecialTokens[id - 256].spelling;
  }
  return text;
}

std::optional<uint32_t> ByteTokenizer::special_token_id(std::string_view spelling) const {
  for (const SpecialToken& special : kByteSpecialTokens)
    if (special.spelling == spelling) return special.id;
  return std::nullopt;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (path.empty()) return std::make_unique<ByteTokenizer>();
  return std::make_unique<BpeTokenizer>(BpeTokenizer::from_file(path));
}

void append_document_tokens(std::vector<uint32_t>& stream, std::string_view text, const Tokenizer& tokenizer) {
  stream.push_back(tokenizer.eos_id());
  const std::vector<uint32_t> ids = tokenizer.encode(text);
  stream.insert(stream.end(), ids.begin(), ids.end());
}

}  // namespace lt
