// printf into a std::string: the numbers in the progress line, the inspect tables and the report page.
#pragma once
#include <string>

namespace lt {

[[gnu::format(printf, 1, 2)]] std::string format_text(const char* format, ...);

}  // namespace lt
