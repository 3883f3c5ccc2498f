// The FLOP accounting of `lingtrain bench` reproduces the peers' figures (docs/performance.md, "What
// the numbers mean"), so GFLOP/s and MFU compare with PyTorch's like for like.
#include <gtest/gtest.h>

#include "bench/flops.h"
#include "model/config.h"

namespace lt {
namespace {

double mflop_per_token(const std::string& preset, int64_t seq_len) {
  return bench::training_flops(preset_config(preset), seq_len).per_token / 1e6;
}

TEST(BenchFlops, MatchesThePeersPerTokenFigures) {
  EXPECT_NEAR(mflop_per_token("moe-s", 256), 27.6, 0.1);
  EXPECT_NEAR(mflop_per_token("moe-m", 512), 193.4, 0.1);
  // SwiGLU 2048 has the matmul parameters of GPT-2's 4C MLP: the same 748.3 MFLOP as gpt2-124m.
  EXPECT_NEAR(mflop_per_token("dense-124m", 64), 748.3, 0.1);
}

TEST(BenchFlops, SplitsMatmulAndAttention) {
  const bench::TrainingFlops f = bench::training_flops(preset_config("moe-s"), 256);
  // The peers' exact counts: 4,079,616 active matmul parameters, attention 12 * 4 * 8 * 32 * 256.
  EXPECT_EQ(f.active_matmul_params, 4079616);
  EXPECT_EQ(f.matmul_per_token, 6.0 * 4079616);
  EXPECT_EQ(f.attention_per_token, 12.0 * 4 * 8 * 32 * 256);
  EXPECT_EQ(f.per_token, f.matmul_per_token + f.attention_per_token);
}

}  // namespace
}  // namespace lt
