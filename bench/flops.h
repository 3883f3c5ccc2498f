// Training FLOPs per token, counted the way the PyTorch peers count them (docs/performance.md, "What
// the numbers mean"), so GFLOP/s and MFU compare like for like: 6 x the matmul parameters a token
// passes through (forward 2, backward 4: one GEMM for the input gradient and one for the weight
// gradient) plus the attention score and value products over the full T x T matrix,
// 12 x layers x heads x head_dim x T.
//
// Active matmul parameters: per layer the fused QKV and output projections, and either the dense
// SwiGLU MLP or the router + shared expert + top-k routed experts; then the LM head. The embedding is
// a row lookup, not a matmul, and norms are not matmuls. The causal mask's skipped half is counted
// anyway (the "full score matrix" convention), as the peers do.
#pragma once
#include <cstdint>

#include "model/config.h"

namespace lt::bench {

struct TrainingFlops {
  int64_t active_matmul_params = 0;
  double matmul_per_token = 0;     // 6 x active_matmul_params
  double attention_per_token = 0;  // 12 x layers x heads x head_dim x seq_len
  double per_token = 0;            // the sum: what tokens/s is multiplied by
};

TrainingFlops training_flops(const LingConfig& config, int64_t seq_len);

}  // namespace lt::bench
