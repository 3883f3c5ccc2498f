// A small, fast random generator (xoshiro256** seeded by splitmix64). Everything random in lingtrain
// (init, the routing warmup's noise, shuffling, sampling) draws from one of these, seeded from the run's
// seed and what it draws for (tensor/derive_seed.h), so a seed fixes a run and a checkpoint needs no
// generator state.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace lt {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }

  void reseed(uint64_t seed) {
    uint64_t x = seed;
    for (auto& word : state_) {
      x += 0x9E3779B97F4A7C15ull;
      uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      word = z ^ (z >> 31);
    }
    has_spare_normal_ = false;
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>(uniform() * static_cast<double>(n)); }

  // Standard normal by Box-Muller; the second value of each pair is kept for the next call.
  double normal() {
    if (has_spare_normal_) {
      has_spare_normal_ = false;
      return spare_normal_;
    }
    const std::array<double, 2> u = uniform_pair();
    const std::array<double, 2> pair = box_muller(u[0], u[1]);
    spare_normal_ = pair[1];
    has_spare_normal_ = true;
    return pair[0];
  }

  // out[i] = normal() for i in [0, n), in order: the same values, the spare carried in and out alike.
  // The uniforms are drawn in order (about a nanosecond each) and the pairs' transforms, the costly part
  // (a log, a square root, a sine and a cosine), spread over the thread pool: the weights of a model of
  // billions of parameters are drawn in seconds rather than minutes. random.cpp.
  void fill_normal(double* out, int64_t n);

 private:
  // u1 in (0, 1) (a zero drawn again: log(0) is -inf) and u2 in [0, 1).
  std::array<double, 2> uniform_pair() {
    double u1 = uniform();
    while (u1 <= 0.0) u1 = uniform();
    return {u1, uniform()};
  }
  static std::array<double, 2> box_muller(double u1, double u2) {
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586 * u2;
    return {radius * std::cos(angle), radius * std::sin(angle)};
  }

  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<uint64_t, 4> state_{};
  bool has_spare_normal_ = false;
  double spare_normal_ = 0.0;
};

}  // namespace lt
