// The bridge between lingtrain's parameters and the Hugging Face checkpoint layout
// (docs/architecture.md §6).
// Every parameter already carries its Hugging Face name, except two kinds:
// - the routed experts, which lingtrain stores stacked per projection
//   ("model.layers.3.mlp.experts.down_proj.weight", [E, H, I]) and the checkpoint one tensor per expert
//   ("model.layers.3.mlp.experts.7.down_proj.weight", [H, I]);
// - the gate and up projections, which lingtrain fuses into one weight whose first half of rows is the gate's
//   ("...mlp.gate_up_proj.weight" [2I, H], the experts' [E, 2I, H]: nn/layers.h init_gate_up) and the
//   checkpoint stores apart ("...mlp.gate_proj.weight" and "...mlp.up_proj.weight", [I, H] each).
#pragma once
#include <string>

#include "io/safetensors.h"
#include "model/ling.h"

namespace lt {

// The model's weights under Hugging Face names, per-expert and per-projection tensors as views of the
// stacked and fused ones. A model holding a slice of its experts (expert parallel) names them by their
// global numbers.
NamedTensors hf_state_dict(LingForCausalLM& model);
// The same mapping for any tensors laid out like the parameters (their gradients, say), given under the
// parameters' lingtrain names; stacked experts are numbered from first_expert.
NamedTensors hf_named(const NamedTensors& by_parameter_name, int64_t first_expert = 0);
// Whether a lingtrain parameter name is a MoE layer's stacked routed experts ([E, ...]).
bool is_stacked_experts(const std::string& parameter_name);
// This model's part of a whole-model tensor of parameter `parameter_name` (a checkpoint's weight or
// AdamW moment): the held experts' rows of stacked experts under expert parallelism, else all of it.
Tensor held_part(const LingForCausalLM& model, const std::string& parameter_name, const Tensor& whole);
// Copies a checkpoint's tensors into the model; every name must be present with the expected shape
// (errors name `file`). Extra tensors in the file are an error too: they mean a different model (the
// experts another expert-parallel rank holds excepted).
void load_hf_state_dict(LingForCausalLM& model, const SafetensorsFile& file);

}  // namespace lt
