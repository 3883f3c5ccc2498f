// The bridge between lingtrain's parameters and the Hugging Face checkpoint layout
// (docs/architecture.md §6).
// Every parameter already carries its Hugging Face name, except the routed experts, which lingtrain
// stores stacked per projection ("model.layers.3.mlp.experts.gate_proj.weight", [E, I, H]) and the
// checkpoint stores one tensor per expert ("model.layers.3.mlp.experts.7.gate_proj.weight", [I, H]).
#pragma once
#include <string>

#include "io/safetensors.h"
#include "model/ling.h"

namespace lt {

// The model's weights under Hugging Face names, per-expert tensors as views of the stacked ones.
NamedTensors hf_state_dict(LingForCausalLM& model);
// Copies a checkpoint's tensors into the model; every name must be present with the expected shape
// (errors name `file`). Extra tensors in the file are an error too: they mean a different model.
void load_hf_state_dict(LingForCausalLM& model, const SafetensorsFile& file);

}  // namespace lt
