// Regular expressions for the tokenizers' pre-tokenizer patterns, through PCRE2 (Debian's libpcre2-8).
//
// Patterns are compiled in UTF-8 mode with Unicode properties on (\p{L}, \p{N}, and \s, \w matching
// Unicode spaces and letters), as the Hugging Face patterns expect, and JIT-compiled where PCRE2 can.
// The subject may hold invalid UTF-8 (any bytes can be tokenised byte-level): such bytes never match a
// pattern character, so they fall into the gaps between matches.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "tensor/threadpool.h"  // FunctionRef

struct pcre2_real_code_8;

namespace lt {

class Regex {
 public:
  // Fails with the pattern, PCRE2's message and the offset of the error.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }
  // Calls on_match(begin, end) (byte offsets) for each non-empty, non-overlapping match, left to right.
  void for_each_match(std::string_view text, FunctionRef<void(size_t begin, size_t end)> on_match) const;

 private:
  std::string pattern_;
  pcre2_real_code_8* code_ = nullptr;
};

}  // namespace lt
