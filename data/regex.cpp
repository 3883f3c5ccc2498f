#include "data/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <utility>

#include "tensor/error.h"

namespace lt {

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    fail("regular expression '", pattern, "': ", reinterpret_cast<const char*>(message), " at offset ", error_offset);
  }
  // JIT makes matching several times faster; where the CPU has no JIT support, the interpreter runs.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(code_); }

Regex::Regex(Regex&& other) noexcept
    : pattern_(std::move(other.pattern_)), code_(std::exchange(other.code_, nullptr)) {}

Regex& Regex::operator=(Regex&& other) noexcept {
  std::swap(pattern_, other.pattern_);
  std::swap(code_, other.code_);
  return *this;
}

void Regex::for_each_match(std::string_view text, FunctionRef<void(size_t begin, size_t end)> on_match) const {
  const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(code_, subject, text.size(), offset, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    LT_CHECK(rc >= 0, "regular expression '", pattern_, "': matching failed (PCRE2 error ", rc, ")");
    const PCRE2_SIZE* bounds = pcre2_get_ovector_pointer(match.get());
    if (bounds[1] > bounds[0]) {
      on_match(bounds[0], bounds[1]);
      offset = bounds[1];
    } else {
      // An empty match: step over one character (a UTF-8 lead byte and its continuation bytes).
      offset = bounds[0] + 1;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
    }
  }
}

}  // namespace lt
