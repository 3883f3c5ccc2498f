// A model's weights written as a sharded Hugging Face folder (index + shards, as the released Ling
// checkpoints ship, with their config.json) load into a fresh model bit for bit, through the same
// checkpoint loader that eval, sample and resume use.
#include <gtest/gtest.h>

#include <cstring>

#include "model/hf_names.h"
#include "model/ling.h"
#include "tests/io/sharded_folder.h"
#include "tests/io/temp_dir.h"
#include "tests/model/small_config.h"
#include "trainer/checkpoint.h"

namespace lt {
namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(ShardedLoad, TwoShardsLoadIntoAFreshModelBitForBit) {
  test::TempDir dir;
  LingForCausalLM saved(test::small_config(), 1);
  test::write_sharded_folder(dir.root(), hf_state_dict(saved), 2);
  write_json_file(dir.root() + "/config.json", config_to_json(saved.config()));

  LingForCausalLM loaded(test::small_config(), 2);
  const std::vector<Parameter> expected = saved.parameters(), before = loaded.parameters();
  ASSERT_EQ(before.size(), expected.size());
  ASSERT_FALSE(same_bytes(before[0].value->value(), expected[0].value->value())) << "the seeds give equal weights";

  EXPECT_EQ(config_to_json(load_checkpoint_config(dir.root())), config_to_json(saved.config()));
  load_checkpoint_weights(dir.root(), loaded);
  const std::vector<Parameter> after = loaded.parameters();
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(after[i].name, expected[i].name);
    EXPECT_TRUE(same_bytes(after[i].value->value(), expected[i].value->value())) << expected[i].name;
  }
}

}  // namespace
}  // namespace lt
