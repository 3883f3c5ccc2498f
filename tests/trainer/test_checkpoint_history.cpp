#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/io/temp_dir.h"
#include "trainer/checkpoint.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::write_raw_file;

// A stand-in checkpoint of `step`: what retire_checkpoint reads of one (its config.json and step).
void fake_checkpoint(const std::string& dir, int64_t step) {
  fs::create_directories(dir);
  write_raw_file(dir + "/config.json", "{}");
  write_raw_file(dir + "/trainer_state.json", "{\"state\": {\"step\": " + std::to_string(step) + "}}");
}

std::vector<int64_t> kept_steps(const std::string& out) {
  std::vector<int64_t> steps;
  for (const KeptCheckpoint& k : checkpoint_history(out)) steps.push_back(k.step);
  return steps;
}

// Saves every 10 steps up to 100, each replacing the one before: the last K - 1 and the multiples of M stay.
TEST(CheckpointHistory, KeepsTheLastOnesAndEveryMth) {
  TempDir dir;
  const std::string out = dir.root();
  for (int64_t step = 10; step <= 100; step += 10) {
    fake_checkpoint(out + "/previous", step - 10);
    retire_checkpoint(out + "/previous", out, step, /*keep=*/3, /*keep_every=*/40);
  }
  EXPECT_EQ(kept_steps(out), (std::vector<int64_t>{0, 40, 80, 90}));
  EXPECT_FALSE(fs::exists(out + "/previous"));
}

TEST(CheckpointHistory, KeepOneRemovesThePrevious) {
  TempDir dir;
  fake_checkpoint(dir.path("previous"), 10);
  retire_checkpoint(dir.path("previous"), dir.root(), 20, 1, 0);
  EXPECT_TRUE(kept_steps(dir.root()).empty());
  EXPECT_FALSE(fs::exists(dir.path("previous")));
}

// A run that went back to step 30 and saves step 40: the checkpoints of steps 40 and later belong to the
// timeline it left, and go; a half-removed one of a killed run goes too.
TEST(CheckpointHistory, AnAbandonedTimelineIsDropped) {
  TempDir dir;
  const std::string out = dir.root();
  for (int64_t step : {20, 30, 40, 50})
    fake_checkpoint(checkpoint_history_dir(out) + "/step-000000" + std::to_string(step), step);
  fake_checkpoint(checkpoint_history_dir(out) + "/step-00000010.removing", 10);
  fake_checkpoint(out + "/previous", 60);
  retire_checkpoint(out + "/previous", out, 40, 5, 0);
  EXPECT_EQ(kept_steps(out), (std::vector<int64_t>{20, 30}));
  EXPECT_FALSE(fs::exists(checkpoint_history_dir(out) + "/step-00000010.removing"));
}

TEST(CheckpointHistory, AResumeFromAKeptOneWritesIntoItsRun) {
  EXPECT_EQ(run_folder_of_checkpoint("runs/a/checkpoint"), "runs/a");
  EXPECT_EQ(run_folder_of_checkpoint("runs/a/checkpoint/"), "runs/a");
  EXPECT_EQ(run_folder_of_checkpoint("runs/a/checkpoints/step-00000200"), "runs/a");
  EXPECT_EQ(run_folder_of_checkpoint("checkpoint"), ".");
  EXPECT_EQ(run_folder_of_checkpoint("elsewhere/step-00000200"), "elsewhere");
}

}  // namespace
}  // namespace lt
