// Test helper: writes tensors as a sharded Hugging Face folder, the layout the released Ling models
// ship in (io/safetensors_folder.h), so the loader can be checked against what it must read.
#pragma once
#include <cstdio>
#include <string>

#include "io/json.h"
#include "io/safetensors.h"
#include "io/safetensors_folder.h"

namespace lt::test {

// "model-00002-of-00003.safetensors", the Hub's shard names.
inline std::string shard_name(int shard, int shards) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard + 1, shards);
  return name;
}

// Splits `tensors` in order into `shards` consecutive runs, writes each run as a shard of `dir` and
// returns the index, which it writes too; tests edit the returned index to plant a disagreement.
inline Json write_sharded_folder(const std::string& dir, const NamedTensors& tensors, int shards) {
  Json index;
  uint64_t total_size = 0;
  for (int shard = 0; shard < shards; ++shard) {
    const size_t begin = tensors.size() * shard / shards, end = tensors.size() * (shard + 1) / shards;
    const NamedTensors part(tensors.begin() + begin, tensors.begin() + end);
    save_safetensors(dir + "/" + shard_name(shard, shards), part, {{"format", "pt"}});
    for (const auto& [name, tensor] : part) {
      index["weight_map"][name] = shard_name(shard, shards);
      total_size += tensor.nbytes();
    }
  }
  index["metadata"]["total_size"] = total_size;
  write_json_file(dir + "/" + kSafetensorsIndexFileName, index);
  return index;
}

}  // namespace lt::test
