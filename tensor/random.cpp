#include "tensor/random.h"

#include <algorithm>
#include <vector>

#include "tensor/threadpool.h"

namespace lt {

void Rng::fill_normal(double* out, int64_t n) {
  int64_t i = 0;
  if (n > 0 && has_spare_normal_) {
    out[i++] = spare_normal_;
    has_spare_normal_ = false;
  }
  // Pairs in blocks: a block's uniforms drawn in order, then its pairs transformed in parallel (each
  // pair's values depend on its two uniforms alone, so the split cannot change them).
  constexpr int64_t kBlockPairs = int64_t{1} << 20;
  std::vector<std::array<double, 2>> uniforms;
  while (n - i >= 2) {
    const int64_t pairs = std::min(kBlockPairs, (n - i) / 2);
    uniforms.resize(static_cast<size_t>(pairs));
    for (std::array<double, 2>& u : uniforms) u = uniform_pair();
    double* block = out + i;
    parallel_for(pairs, 4096, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const std::array<double, 2>& u = uniforms[static_cast<size_t>(p)];
        const std::array<double, 2> pair = box_muller(u[0], u[1]);
        block[2 * p] = pair[0];
        block[2 * p + 1] = pair[1];
      }
    });
    i += 2 * pairs;
  }
  if (i < n) out[i] = normal();  // an odd count: the last pair's second value becomes the spare
}

}  // namespace lt
