// Tokenizers turn text into token ids and back. The interface is what training, SFT and sampling need;
// the default ByteTokenizer needs no files, and BpeTokenizer (data/bpe_tokenizer.h) reads a Hugging Face
// tokenizer.json of the byte-level BPE kind.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual int64_t vocab_size() const = 0;
  // <|endoftext|>: separates documents in shards and ends every assistant reply in SFT
  // (docs/architecture.md §12.1, §12.3, §13.1).
  virtual uint32_t eos_id() const = 0;
  virtual uint32_t pad_id() const { return eos_id(); }  // Ling pads with eos

  // Plain text: a special token's spelling inside the text ("<|endoftext|>" in a web page) stays
  // ordinary text, so untrusted data cannot inject document boundaries or chat roles.
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  // Text in which special-token spellings become their ids: the output of a chat template.
  virtual std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const = 0;
  // Special tokens come out as their spelling. Fails on an id outside the vocabulary.
  virtual std::string decode(std::span<const uint32_t> ids) const = 0;
  virtual std::optional<uint32_t> special_token_id(std::string_view spelling) const = 0;
};

// The tokenizer of a --tokenizer flag: a tokenizer.json, or the byte tokenizer when `path` is empty.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// How a document enters a token stream (a shard): eos first, then its plain-text tokens, as llm.c's
// data scripts write them. Every document then starts from the same context, and the model learns to
// predict eos where a document ends because the next document's eos follows it.
void append_document_tokens(std::vector<uint32_t>& stream, std::string_view text, const Tokenizer& tokenizer);

// Ids 0..255 are the bytes themselves (UTF-8 text is its bytes), then the special tokens. The Ling
// chat markers are here from the start, so adding chat data later does not change the vocabulary
// (and with it the shape of every embedding in existing checkpoints).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr uint32_t kEndOfText = 256;  // <|endoftext|>, eos and pad
  static constexpr uint32_t kRoleOpen = 257;   // <role>
  static constexpr uint32_t kRoleClose = 258;  // </role>
  static constexpr int64_t kVocabSize = 259;

  int64_t vocab_size() const override { return kVocabSize; }
  uint32_t eos_id() const override { return kEndOfText; }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const override;
  std::string decode(std::span<const uint32_t> ids) const override;
  std::optional<uint32_t> special_token_id(std::string_view spelling) const override;
};

}  // namespace lt
