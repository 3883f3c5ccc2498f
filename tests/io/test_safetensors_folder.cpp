// Hugging Face model folders: one model.safetensors, or an index plus shards (io/safetensors_folder.h).
// A sharded folder loads bit for bit like the single file, and each way the index and the shards can
// disagree is one error naming the file at fault.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/safetensors_folder.h"
#include "tensor/random.h"
#include "tests/io/sharded_folder.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

using test::expect_error;
using test::shard_name;
using test::TempDir;
using test::write_raw_file;
using test::write_sharded_folder;

// A small model's worth of tensors under Hugging Face names, in the dtypes a checkpoint may hold.
NamedTensors model_tensors() {
  Rng rng(11);
  return {
      {"model.word_embeddings.weight", Tensor::randn({6, 4}, rng, 1.0, DType::BF16)},
      {"model.layers.0.input_layernorm.weight", Tensor::randn({4}, rng)},
      {"model.layers.0.attention.query_key_value.weight", Tensor::randn({8, 4}, rng)},
      {"model.layers.0.attention.dense.weight", Tensor::randn({4, 4}, rng)},
      {"model.layers.0.mlp.gate.weight", Tensor::randn({3, 4}, rng, 1.0, DType::F64)},
      {"model.layers.0.mlp.experts.0.gate_proj.weight", Tensor::randn({2, 4}, rng, 1.0, DType::BF16)},
      {"model.norm.weight", Tensor::randn({4}, rng)},
      {"lm_head.weight", Tensor::randn({6, 4}, rng)},
  };
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A folder of model_tensors() over three shards; returns its index for tests to edit.
class ShardedFolder : public ::testing::Test {
 protected:
  void SetUp() override { index_ = write_sharded_folder(dir_.root(), model_tensors(), 3); }
  std::string index_path() const { return dir_.path(kSafetensorsIndexFileName); }
  std::string shard_path(int shard) const { return dir_.path(shard_name(shard, 3)); }
  void rewrite_index() const { write_json_file(index_path(), index_); }

  TempDir dir_;
  Json index_;
};

TEST_F(ShardedFolder, LoadsBitForBitLikeTheSingleFile) {
  TempDir single;
  save_safetensors(single.path(kSafetensorsFileName), model_tensors(), {{"format", "pt"}});
  const SafetensorsFile one = load_safetensors_folder(single.root());
  EXPECT_EQ(one.path, single.path(kSafetensorsFileName));

  const SafetensorsFile sharded = load_safetensors_folder(dir_.root());
  EXPECT_EQ(sharded.path, index_path());
  EXPECT_EQ(sharded.metadata, one.metadata);
  ASSERT_EQ(sharded.tensors.size(), model_tensors().size());
  ASSERT_EQ(sharded.tensors.size(), one.tensors.size());
  for (const auto& [name, tensor] : one.tensors) {
    ASSERT_TRUE(sharded.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(sharded.tensors.at(name), tensor)) << name;
  }
  // Every shard holds a part: the folder really is split three ways.
  for (int shard = 0; shard < 3; ++shard) EXPECT_FALSE(read_safetensors_header(shard_path(shard)).entries.empty());
}

TEST_F(ShardedFolder, MalformedIndexNamesTheIndex) {
  write_raw_file(index_path(), R"({"weight_map": {"lm_head.weight": )");
  expect_error([&] { load_safetensors_folder(dir_.root()); }, {index_path(), "invalid JSON"});
  write_raw_file(index_path(), R"({"metadata": {}})");
  expect_error([&] { load_safetensors_folder(dir_.root()); }, {index_path(), "weight_map"});
  write_raw_file(index_path(), R"({"weight_map": {"lm_head.weight": 3}})");
  expect_error([&] { load_safetensors_folder(dir_.root()); }, {index_path(), "weight_map.lm_head.weight", "string"});
  write_raw_file(index_path(), R"({"weight_map": {}})");
  expect_error([&] { load_safetensors_folder(dir_.root()); }, {index_path(), "no tensors"});
}

TEST_F(ShardedFolder, MissingShard) {
  std::filesystem::remove(shard_path(1));
  expect_error([&] { load_safetensors_folder(dir_.root()); }, {index_path(), shard_path(1), "missing"});
}

TEST_F(ShardedFolder, TensorListedButAbsentFromItsShard) {
  index_["weight_map"]["model.layers.1.input_layernorm.weight"] = shard_name(2, 3);
  rewrite_index();
  expect_error([&] { load_safetensors_folder(dir_.root()); },
               {index_path(), "'model.layers.1.input_layernorm.weight'", shard_path(2), "does not hold it"});
}

TEST_F(ShardedFolder, TensorInAShardButNotInTheIndex) {
  index_["weight_map"].erase("model.norm.weight");
  rewrite_index();
  expect_error([&] { load_safetensors_folder(dir_.root()); },
               {shard_path(2), "'model.norm.weight'", "not in the index", index_path()});
}

// An index that lists nothing in one of the folder's shards leaves that shard's tensors unlisted too.
TEST_F(ShardedFolder, ShardTheIndexNeverMentions) {
  Json& weight_map = index_["weight_map"];
  for (const auto& [name, tensor] : model_tensors())
    if (weight_map.at(name) == shard_name(1, 3)) weight_map.erase(name);
  rewrite_index();
  expect_error([&] { load_safetensors_folder(dir_.root()); }, {shard_path(1), "not in the index", index_path()});
}

TEST_F(ShardedFolder, TensorInAnotherShardThanListed) {
  const std::string listed = index_.at("weight_map").at("lm_head.weight").get<std::string>();
  index_["weight_map"]["lm_head.weight"] = shard_name(0, 3);
  rewrite_index();
  expect_error([&] { load_safetensors_folder(dir_.root()); },
               {index_path(), "'lm_head.weight'", "listed in " + shard_name(0, 3), dir_.path(listed)});
}

TEST_F(ShardedFolder, DuplicateNameAcrossShards) {
  // The last shard gets a second copy of a tensor the index places in the first.
  NamedTensors last;
  for (const auto& named : model_tensors())
    if (index_.at("weight_map").at(named.first) == shard_name(2, 3)) last.push_back(named);
  last.push_back(model_tensors().front());
  save_safetensors(shard_path(2), last);
  expect_error([&] { load_safetensors_folder(dir_.root()); },
               {index_path(), "'model.word_embeddings.weight'", "two shards", shard_path(0), shard_path(2)});
}

TEST_F(ShardedFolder, ShardOutsideTheFolderIsRefused) {
  index_["weight_map"]["lm_head.weight"] = "../elsewhere.safetensors";
  rewrite_index();
  expect_error([&] { load_safetensors_folder(dir_.root()); },
               {index_path(), "'../elsewhere.safetensors'", "not a file name inside the folder"});
}

TEST_F(ShardedFolder, BothLayoutsInOneFolderAreRefused) {
  save_safetensors(dir_.path(kSafetensorsFileName), model_tensors());
  expect_error([&] { load_safetensors_folder(dir_.root()); }, {dir_.root(), "both", kSafetensorsIndexFileName});
}

TEST(SafetensorsFolder, EmptyOrMissingFolderNamesIt) {
  TempDir dir;
  expect_error([&] { load_safetensors_folder(dir.root()); }, {dir.root(), "neither", kSafetensorsFileName});
  expect_error([&] { load_safetensors_folder(dir.path("absent")); }, {dir.path("absent"), "no such folder"});
}

}  // namespace
}  // namespace lt
