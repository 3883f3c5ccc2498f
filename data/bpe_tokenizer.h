// Byte-level BPE, the kind of GPT-2, Llama-3 and Ling: loaded from a Hugging Face tokenizer.json and
// encoding id for id as the Hugging Face implementation does (tests/data/test_bpe_tokenizer.cpp checks
// goldens made by Hugging Face's tokenizers.js, scripts/tokenizer_goldens/).
//
// Encoding a text, as Hugging Face does it:
//   1. added tokens (added_tokens: <|endoftext|>, chat markers) are cut out first, longest match at the
//      leftmost position; lstrip/rstrip absorb the ASCII whitespace beside them;
//   2. each stretch of text between them is pre-tokenised: the pre_tokenizer's steps (Split by a
//      regular expression with its behaviour, Digits, ByteLevel with or without the GPT-2 pattern) cut
//      it into pieces, each step working on the pieces of the one before;
//   3. each piece's bytes become byte-level symbols (GPT-2's bytes_to_unicode), and the merges apply,
//      lowest rank first, leftmost first among equal ranks, until none applies; with ignore_merges
//      (Llama-3) a piece that is itself in the vocabulary is taken whole first.
// The post_processor is not applied (no BOS added): lingtrain puts <|endoftext|> before each document
// itself and the chat template writes its own markers.
//
// What is refused, with one line naming the file and the part: a model other than BPE, a normalizer,
// byte_fallback, subword prefixes or suffixes, dropout, a pre-tokenizer step or split behaviour not
// listed above, single_word added tokens, merges naming unknown tokens, a vocabulary without the 256
// byte-level symbols.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/tokenizer.h"
#include "io/json.h"

namespace lt {

class Regex;

// The pre_tokenizer of a byte-level tokenizer.json: the steps that cut text into the pieces BPE merges
// within (step 2 above). The BPE trainer uses it too, so a trained tokenizer splits as it was trained.
class PreTokenizer {
 public:
  // Fails unless the steps end with ByteLevel (see above for what else is refused).
  static PreTokenizer from_json(const Json& pre_tokenizer, const std::string& source);
  // Appends the pieces of `text` to `pieces`: views of `text`, or of strings added to `owned` for pieces
  // that ByteLevel gave a prefix space.
  void split(std::string_view text, std::vector<std::string_view>& pieces, std::deque<std::string>& owned) const;

  // How a piece splits in one step (Hugging Face's SplitDelimiterBehavior).
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    std::shared_ptr<const Regex> regex;  // null: this step only maps bytes (ByteLevel without its regex)
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel: a piece not starting with ' ' gets one in front
  };

 private:
  std::vector<Step> steps_;
};

// The pre_tokenizer JSON of the named pattern: "gpt2" (ByteLevel with GPT-2's pattern), "llama3"
// (Llama-3's pattern: digits in runs of up to three) or "ling" (the Llama-3 pattern with each digit
// alone, as Ling's tokenizer splits numbers). Fails on another name, listing these.
Json named_pre_tokenizer(const std::string& name);

class BpeTokenizer final : public Tokenizer {
 public:
  static BpeTokenizer from_file(const std::string& path);
  // `source` names the tokenizer in errors (its path).
  static BpeTokenizer from_json(const Json& json, const std::string& source);
  ~BpeTokenizer() override;
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;

  int64_t vocab_size() const override { return vocab_size_; }
  // <|endoftext|> (GPT-2, Ling), else <|end_of_text|> (Llama-3); a tokenizer with neither is refused.
  uint32_t eos_id() const override { return eos_id_; }
  // Plain text: only the added tokens that are not special are cut out (see Tokenizer::encode).
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::vector<uint32_t> encode_with_special_tokens(std::string_view text) const override;
  std::string decode(std::span<const uint32_t> ids) const override;
  std::optional<uint32_t> special_token_id(std::string_view spelling) const override;

 private:
  BpeTokenizer() = default;
  struct AddedToken {
    std::string content;
    uint32_t id = 0;
    bool special = false, lstrip = false, rstrip = false;
  };
  struct EncodeScratch;
  std::vector<uint32_t> encode_impl(std::string_view text, bool with_special) const;
  void encode_text(std::string_view text, std::vector<uint32_t>& ids, EncodeScratch& scratch) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>& ids) const;

  int64_t vocab_size_ = 0;
  uint32_t eos_id_ = 0;
  bool ignore_merges_ = false;
  PreTokenizer pre_tokenizer_;
  std::vector<AddedToken> added_;                    // longest first, so the first match is the longest
  bool starts_added_[256] = {};                      // whether some added token starts with this byte
  std::vector<std::string> id_bytes_;                // the bytes each id decodes to
  std::vector<bool> id_defined_;                     // ids in no vocabulary (holes) decode to an error
  std::unordered_map<std::string, uint32_t> vocab_;  // byte-level spelling -> id
  uint32_t byte_id_[256] = {};
  // (left id << 32 | right id) -> (rank << 32 | merged id)
  std::unordered_map<uint64_t, uint64_t> merges_;
};

// GPT-2's bytes_to_unicode: the printable Latin-1 bytes stand for themselves and the others are shifted
// to U+0100 onwards, so every byte is one visible character in vocab and merges. The UTF-8 spelling of
// byte b's character.
const std::string& byte_level_char(uint8_t b);

}  // namespace lt
