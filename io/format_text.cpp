#include "io/format_text.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <string>

namespace lt {

std::string format_text(const char* format, ...) {
  va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  // The first pass measures, the second writes (vsnprintf adds the terminating NUL that size() + 1 leaves room for).
  std::string text(static_cast<size_t>(std::max(0, std::vsnprintf(nullptr, 0, format, args))), '\0');
  std::vsnprintf(text.data(), text.size() + 1, format, again);
  va_end(again);
  va_end(args);
  return text;
}

std::string count_of(long long count, const char* noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

}  // namespace lt
