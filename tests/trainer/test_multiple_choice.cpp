// Multiple-choice scores against the PyTorch reference (tests/reference/ling_reference.py mc, written from
// lm-evaluation-harness's rules, with its own byte tokenizer and HellaSwag preprocessing): a tiny random
// model of 40 positions, seven items (plain and HellaSwag, two longer than the positions, one with no
// context), each scored there one sequence at a time in float64. Regenerate with
//   /usr/bin/python3 tests/reference/ling_reference.py mc --out tests/golden/multiple_choice
// Here the choices go packed several to a row, in f32: each choice's summed log-prob agrees within 1e-4
// absolute (nats), and acc, acc_norm, the argmaxes and the truncations exactly (the reference chose
// weights whose best two choices are 1e-3 apart or more).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <memory>
#include <sstream>
#include <string>

#include "data/tokenizer.h"
#include "model/config.h"
#include "model/hf_names.h"
#include "trainer/multiple_choice.h"

namespace lt {
namespace {

const std::string kDir = std::string(LINGTRAIN_SOURCE_DIR) + "/tests/golden/multiple_choice/";

std::unique_ptr<LingForCausalLM> golden_model() {
  auto model = std::make_unique<LingForCausalLM>(load_config(kDir + "config.json"), 0);
  load_hf_state_dict(*model, load_safetensors(kDir + "model.safetensors"));
  return model;
}

TEST(MultipleChoiceGolden, ScoresMatchTheReference) {
  const Json golden = read_json_file(kDir + "scores.json");
  const std::vector<MultipleChoiceItem> items = read_multiple_choice_file(kDir + "items.jsonl");
  const std::unique_ptr<LingForCausalLM> model = golden_model();
  const ByteTokenizer tokenizer;
  for (int64_t batch : {1, 3}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    MultipleChoiceSettings settings;
    settings.batch = batch;
    const MultipleChoiceResult result = evaluate_multiple_choice(*model, tokenizer, items, settings);
    ASSERT_EQ(result.items.size(), golden.at("items").size());
    double worst = 0;
    for (size_t i = 0; i < result.items.size(); ++i) {
      const Json& expected = golden.at("items")[i];
      const MultipleChoiceScore& got = result.items[i];
      const std::vector<double> logprobs = expected.at("logprobs").get<std::vector<double>>();
      ASSERT_EQ(got.logprobs.size(), logprobs.size()) << "item " << i;
      for (size_t c = 0; c < logprobs.size(); ++c) worst = std::max(worst, std::fabs(got.logprobs[c] - logprobs[c]));
      EXPECT_EQ(got.predicted, expected.at("predicted").get<int64_t>()) << "item " << i;
      EXPECT_EQ(got.predicted_norm, expected.at("predicted_norm").get<int64_t>()) << "item " << i;
      EXPECT_EQ(got.truncated, expected.at("truncated").get<bool>()) << "item " << i;
    }
    EXPECT_LE(worst, 1e-4);
    std::ostringstream worst_text;
    worst_text << std::scientific << std::setprecision(2) << worst;
    RecordProperty("max_abs_difference_batch_" + std::to_string(batch), worst_text.str());
    EXPECT_DOUBLE_EQ(result.acc, golden.at("acc").get<double>());
    EXPECT_DOUBLE_EQ(result.acc_norm, golden.at("acc_norm").get<double>());
    EXPECT_EQ(result.n, golden.at("n").get<int64_t>());
    EXPECT_EQ(result.truncated, golden.at("truncated").get<int64_t>());
    // Items of 3, 4, 3, 4, 2, 2 and 2 choices.
    EXPECT_NEAR(result.chance, (1.0 / 3 + 0.25 + 1.0 / 3 + 0.25 + 0.5 * 3) / 7, 1e-12);
  }
}

TEST(MultipleChoiceGolden, ProgressCountsItemsInOrder) {
  const std::vector<MultipleChoiceItem> items = read_multiple_choice_file(kDir + "items.jsonl");
  const std::unique_ptr<LingForCausalLM> model = golden_model();
  const ByteTokenizer tokenizer;
  std::vector<int64_t> done;
  MultipleChoiceSettings settings;
  settings.batch = 1;
  int64_t last_correct = 0;
  settings.on_progress = [&](int64_t items_done, int64_t correct) {
    done.push_back(items_done);
    last_correct = correct;
  };
  const MultipleChoiceResult result = evaluate_multiple_choice(*model, tokenizer, items, settings);
  ASSERT_FALSE(done.empty());
  EXPECT_TRUE(std::is_sorted(done.begin(), done.end()));
  EXPECT_EQ(done.back(), 7);
  EXPECT_DOUBLE_EQ(static_cast<double>(last_correct) / 7, result.acc);
}

TEST(MultipleChoiceGolden, FewShotPromptsComeFromThePoolAndCount) {
  const std::vector<MultipleChoiceItem> items = read_multiple_choice_file(kDir + "items.jsonl");
  const std::unique_ptr<LingForCausalLM> model = golden_model();
  const ByteTokenizer tokenizer;
  MultipleChoiceSettings settings;
  settings.shots = 3;
  const MultipleChoiceResult with_examples = evaluate_multiple_choice(*model, tokenizer, items, settings);
  // Three solved examples (the shortest three take 42 bytes) make every prompt longer than the model's 40
  // positions.
  EXPECT_EQ(with_examples.truncated, 7);
  EXPECT_EQ(with_examples.shots, 3);
  EXPECT_EQ(evaluate_multiple_choice(*model, tokenizer, items, settings).items[0].logprobs,
            with_examples.items[0].logprobs);  // the same examples for the same seed
  const std::vector<MultipleChoiceItem> pool = {items[0]};
  settings.shots = 1;
  settings.fewshot_pool = &pool;
  const MultipleChoiceResult from_pool = evaluate_multiple_choice(*model, tokenizer, items, settings);
  EXPECT_EQ(from_pool.n, 7);
}

}  // namespace
}  // namespace lt
