// qkv_attention is attention of the RoPE-rotated column blocks of the fused projection: the same
// values and gradients as the unfused slice_cols -> rope -> attention chain it replaces.
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "tests/test_util.h"

namespace lt {
namespace {

TEST(QkvAttention, MatchesSliceRopeAttention) {
  const int64_t B = 2, T = 19, Hq = 4, Hkv = 2, D = 10, pos_offset = 7;
  const double theta = 600000.0;
  Rng rng(3);
  const Tensor projection = Tensor::randn({B, T, (Hq + 2 * Hkv) * D}, rng, 1.0, DType::F64);
  const Tensor seed = Tensor::randn({B, T, Hq, D}, rng, 1.0, DType::F64);

  const Variable fused_in(projection.clone(), true);
  const Variable fused = qkv_attention(fused_in, Hq, Hkv, theta, pos_offset);
  fused.backward(seed);

  const Variable chain_in(projection.clone(), true);
  const Variable q = rope(reshape(slice_cols(chain_in, 0, Hq * D), {B, T, Hq, D}), theta, pos_offset);
  const Variable k = rope(reshape(slice_cols(chain_in, Hq * D, Hkv * D), {B, T, Hkv, D}), theta, pos_offset);
  const Variable v = reshape(slice_cols(chain_in, (Hq + Hkv) * D, Hkv * D), {B, T, Hkv, D});
  const Variable chain = attention(q, k, v);
  chain.backward(seed);

  test::expect_close(fused.value().to_vector<double>(), chain.value().to_vector<double>(), 1e-13, 1e-15, "out");
  test::expect_close(fused_in.grad().to_vector<double>(), chain_in.grad().to_vector<double>(), 1e-13, 1e-15,
                     "dqkv");
}

}  // namespace
}  // namespace lt
