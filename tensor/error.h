// Errors: every failure is an lt::Error carrying one line of text. The CLI catches it, prints the
// line on stderr and exits non-zero, so bad input never ends in a crash or a half-written file.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace lt {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(const Args&... parts) {
  std::ostringstream line;
  (line << ... << parts);
  throw Error(line.str());
}

}  // namespace lt

// LT_CHECK(cond, "message parts", value, ...): throw lt::Error with the parts joined when cond is false.
#define LT_CHECK(cond, ...)                   \
  do {                                        \
    if (!(cond)) ::lt::fail(__VA_ARGS__);     \
  } while (0)
