// Small helpers for the generators of embedded data (the pre-training corpus, the tool-use set): draws
// from lt::Rng and string assembly whose result never depends on the compiler's evaluation order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/random.h"

namespace lt::random_text {

template <class T, size_t N>
const T& pick(Rng& rng, const T (&items)[N]) {
  return items[rng.below(N)];
}

template <class T>
const T& pick_from(Rng& rng, const std::vector<T>& items) {
  return items[rng.below(items.size())];
}

// Inclusive on both ends.
inline int64_t between(Rng& rng, int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng.below(hi - lo + 1)); }

inline bool chance(Rng& rng, double probability) { return rng.uniform() < probability; }

inline std::string str(std::string_view view) { return std::string(view); }

// Concatenates parts evaluated left to right. The elements of a braced list are sequenced in order,
// while the operands of a chain of + are not: drawing from the Rng inside a + chain would make the
// text depend on the compiler's evaluation order, so every multi-draw concatenation goes through here.
inline std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& part : parts) out += part;
  return out;
}

inline std::string join(const std::vector<std::string>& parts, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += separator;
    out += parts[i];
  }
  return out;
}

}  // namespace lt::random_text
