#include "io/safetensors_folder.h"

#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "io/json.h"
#include "tensor/error.h"

namespace lt {
namespace {

bool exists(const std::string& path) {
  std::error_code ignored;
  return std::filesystem::exists(path, ignored);
}

// A shard must be a file of the folder itself: an index naming "../x" or "/etc/x" is refused.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

SafetensorsFile load_sharded(const std::string& dir, const std::string& index_path) {
  const Json index = read_json_file(index_path);
  const JsonObject weight_map = JsonObject(index, index_path).object("weight_map");
  std::map<std::string, std::string> listed_shard;  // tensor name -> shard file name, from the index
  for (const auto& [name, value] : weight_map.json().items()) {
    const std::string shard = weight_map.get<std::string>(name);
    LT_CHECK(is_plain_file_name(shard), index_path, ": tensor '", name, "' maps to '", shard,
             "', which is not a file name inside the folder");
    listed_shard.emplace(name, shard);
  }
  LT_CHECK(!listed_shard.empty(), index_path, ": weight_map lists no tensors");
  std::set<std::string> shards;  // sorted: a fixed load order
  for (const auto& [name, shard] : listed_shard) shards.insert(shard);
  // A file with a shard's name that the index never mentions holds tensors the index does not list
  // (an index from another download): its headers are checked like the others'.
  std::set<std::string> checked = shards;
  std::error_code error;
  for (const auto& file : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = file.path().filename().string();
    if (name.starts_with("model-") && name.find("-of-") != std::string::npos && name.ends_with(".safetensors"))
      checked.insert(name);
  }
  LT_CHECK(!error, dir, ": cannot list the folder: ", error.message());

  // Headers first: every disagreement between the index and the shards is found before gigabytes of
  // tensor data are read.
  std::map<std::string, std::string> found_in;  // tensor name -> the shard that holds it
  for (const std::string& shard : checked) {
    const std::string path = dir + "/" + shard;
    LT_CHECK(exists(path), index_path, ": shard ", path, " is missing (the index lists tensors in it)");
    for (const SafetensorsEntry& entry : read_safetensors_header(path).entries) {
      const auto [previous, first] = found_in.emplace(entry.name, shard);
      LT_CHECK(first, index_path, ": tensor '", entry.name, "' is in two shards, ", dir, "/", previous->second,
               " and ", path);
    }
  }
  for (const auto& [name, shard] : found_in) {
    const auto listed = listed_shard.find(name);
    LT_CHECK(listed != listed_shard.end(), dir, "/", shard, ": tensor '", name, "' is not in the index ", index_path);
    LT_CHECK(listed->second == shard, index_path, ": tensor '", name, "' is listed in ", listed->second,
             " but is in ", dir, "/", shard);
  }
  for (const auto& [name, shard] : listed_shard)
    LT_CHECK(found_in.count(name), index_path, ": tensor '", name, "' is listed in ", dir, "/", shard,
             ", which does not hold it");

  SafetensorsFile result;
  result.path = index_path;
  for (const std::string& shard : shards) {
    SafetensorsFile part = load_safetensors(dir + "/" + shard);
    result.tensors.merge(part.tensors);
    result.metadata.merge(part.metadata);
  }
  return result;
}

}  // namespace

SafetensorsFile load_safetensors_folder(const std::string& dir) {
  const std::string single = dir + "/" + kSafetensorsFileName, index = dir + "/" + kSafetensorsIndexFileName;
  const bool has_single = exists(single), has_index = exists(index);
  LT_CHECK(!(has_single && has_index), dir, ": holds both ", kSafetensorsFileName, " and ", kSafetensorsIndexFileName,
           "; remove the one that is not the model");
  if (has_index) return load_sharded(dir, index);
  if (has_single) return load_safetensors(single);
  std::error_code ignored;
  LT_CHECK(std::filesystem::is_directory(dir, ignored), dir, ": no such folder");
  fail(dir, ": holds neither ", kSafetensorsFileName, " nor ", kSafetensorsIndexFileName);
}

}  // namespace lt
