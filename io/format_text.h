// printf into a std::string: the numbers in the progress line, the inspect tables and the report page;
// counts with their nouns.
#pragma once
#include <string>

namespace lt {

[[gnu::format(printf, 1, 2)]] std::string format_text(const char* format, ...);

// "1 thread", "2 threads": a count and its noun, plural unless the count is 1 (nouns with a plain -s).
std::string count_of(long long count, const char* noun);

}  // namespace lt
