#include "bench/flops.h"

namespace lt::bench {

TrainingFlops training_flops(const LingConfig& c, int64_t seq_len) {
  const int64_t H = c.hidden_size, head_dim = c.resolved_head_dim();
  const int64_t attention_projections =
      (c.num_attention_heads + 2 * c.num_key_value_heads) * head_dim * H + c.num_attention_heads * head_dim * H;
  const int64_t swiglu_per_width = 3 * H;  // gate, up and down projections of a SwiGLU of width 1
  TrainingFlops f;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    f.active_matmul_params += attention_projections;
    if (c.is_moe_layer(layer)) {
      const int64_t experts_per_token = c.num_experts_per_tok + c.num_shared_experts;
      f.active_matmul_params += c.num_experts * H + experts_per_token * swiglu_per_width * c.moe_intermediate_size;
    } else {
      f.active_matmul_params += swiglu_per_width * c.intermediate_size;
    }
  }
  f.active_matmul_params += c.vocab_size * H;  // LM head
  f.matmul_per_token = 6.0 * static_cast<double>(f.active_matmul_params);
  f.attention_per_token = 12.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads * head_dim * seq_len);
  f.per_token = f.matmul_per_token + f.attention_per_token;
  return f;
}

}  // namespace lt::bench
