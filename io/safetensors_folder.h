// The weights of a Hugging Face model folder, in either layout the Hub uses:
//   model.safetensors                    one file holding every tensor, or
//   model.safetensors.index.json         {"metadata": {"total_size": ...},
//   model-00001-of-00004.safetensors      "weight_map": {"<tensor name>": "<shard file name>", ...}}
//   ...                                  plus the shards it names, as the released Ling models ship.
// The index and the shards must agree exactly: every tensor is in the shard the index names and in
// no other, and no shard (a file the index names, or any model-*-of-*.safetensors beside them) holds
// a tensor the index does not list. A mismatch means a partial download or a mix of two checkpoints,
// so it is an error rather than a guess.
#pragma once
#include <string>

#include "io/safetensors.h"

namespace lt {

inline constexpr const char* kSafetensorsFileName = "model.safetensors";
inline constexpr const char* kSafetensorsIndexFileName = "model.safetensors.index.json";

// Every tensor of the folder `dir`, on the CPU, by name. The result's path is what later errors should
// name: the single file, or the index. Its metadata is the shards' "__metadata__" merged (they all
// carry {"format": "pt"}; where they disagree, the shard first in name order wins). A folder holding
// both layouts is an error: which one is the model cannot be told.
SafetensorsFile load_safetensors_folder(const std::string& dir);

}  // namespace lt
