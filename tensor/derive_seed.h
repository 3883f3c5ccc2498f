// Independent random streams from one seed. lt::Rng seeds its four words from seed + k*γ (splitmix64),
// so Rng(seed) and Rng(seed + γ) would share three of them; hashing (seed, stream) through the
// splitmix64 finaliser first gives every stream (a corpus document, a sampler epoch, the routing noise)
// an unrelated generator. It sits in tensor/ beside lt::Rng so that every layer can derive streams.
#pragma once
#include <cstdint>

namespace lt {

inline uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed ^ (stream * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace lt
