// A Ling config small enough for unit tests that still has every kind of layer: a dense first layer
// (first_k_dense_replace = 1, from tiny), then MoE layers with routed and shared experts.
#pragma once
#include "model/config.h"

namespace lt::test {

inline LingConfig small_ling_config() {
  LingConfig c = preset_config("tiny");
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 48;
  c.moe_intermediate_size = 16;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  return c;
}

}  // namespace lt::test
