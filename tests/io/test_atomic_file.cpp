#include <gtest/gtest.h>

#include <filesystem>
#include <stdexcept>

#include "io/atomic_file.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::read_raw_file;
using test::TempDir;
using test::write_raw_file;

size_t entries_in(const std::string& folder) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(folder), fs::directory_iterator()));
}

TEST(AtomicFile, WritesContentsAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.path("out.txt");
  write_file_atomic(path, "first");
  write_file_atomic(path, [](FileSink& sink) {
    sink.write("second ");
    sink.write("version");
    EXPECT_EQ(sink.bytes_written(), 14u);
  });
  EXPECT_EQ(read_raw_file(path), "second version");
  EXPECT_EQ(entries_in(dir.root()), 1u);
}

TEST(AtomicFile, WriterThatThrowsMidwayLeavesOldFileIntact) {
  TempDir dir;
  const std::string path = dir.path("model.safetensors");
  write_file_atomic(path, "old complete contents");
  EXPECT_THROW(write_file_atomic(path,
                                 [](FileSink& sink) {
                                   sink.write("new half-writ");
                                   throw std::runtime_error("killed mid-write");
                                 }),
               std::runtime_error);
  EXPECT_EQ(read_raw_file(path), "old complete contents");
  EXPECT_EQ(entries_in(dir.root()), 1u) << "the temporary must be removed";
}

TEST(AtomicFile, UnwritableDestinationNamesTheFile) {
  TempDir dir;
  const std::string path = dir.path("missing-folder/out.bin");
  expect_error([&] { write_file_atomic(path, "x"); }, {path, "cannot create"});
}

TEST(AtomicDirectory, BuildsAndReplacesWholeDirectory) {
  TempDir dir;
  const std::string checkpoint = dir.path("ckpt");
  write_directory_atomic(checkpoint, [](const std::string& staging) {
    write_raw_file(staging + "/config.json", "{\"step\": 1}");
    write_raw_file(staging + "/model.safetensors", "weights 1");
  });
  EXPECT_EQ(read_raw_file(checkpoint + "/config.json"), "{\"step\": 1}");

  write_directory_atomic(checkpoint + "/", [](const std::string& staging) {
    fs::create_directories(staging + "/optimizer");
    write_file_atomic(staging + "/config.json", "{\"step\": 2}");
    write_raw_file(staging + "/optimizer/state.bin", "moments");
  });
  EXPECT_EQ(read_raw_file(checkpoint + "/config.json"), "{\"step\": 2}");
  EXPECT_EQ(read_raw_file(checkpoint + "/optimizer/state.bin"), "moments");
  EXPECT_FALSE(fs::exists(checkpoint + "/model.safetensors")) << "the old directory is replaced, not merged";
  EXPECT_EQ(entries_in(dir.root()), 1u) << "no .old or staging folder may remain";
  EXPECT_EQ(find_complete_directory(checkpoint), checkpoint);
}

TEST(AtomicDirectory, FillThatThrowsLeavesOldDirectoryIntact) {
  TempDir dir;
  const std::string checkpoint = dir.path("ckpt");
  write_directory_atomic(checkpoint, [](const std::string& staging) { write_raw_file(staging + "/a", "old"); });
  EXPECT_THROW(write_directory_atomic(checkpoint,
                                      [](const std::string& staging) {
                                        write_raw_file(staging + "/a", "new");
                                        throw std::runtime_error("disk full");
                                      }),
               std::runtime_error);
  EXPECT_EQ(read_raw_file(checkpoint + "/a"), "old");
  EXPECT_EQ(entries_in(dir.root()), 1u);
}

TEST(AtomicDirectory, KilledBetweenRenamesLeavesOldReadableAndNextWriteRecovers) {
  TempDir dir;
  const std::string checkpoint = dir.path("ckpt");
  EXPECT_EQ(find_complete_directory(checkpoint), std::nullopt);
  write_directory_atomic(checkpoint, [](const std::string& staging) { write_raw_file(staging + "/a", "step 1"); });

  // The state a writer killed after "rename <dir> to <dir>.old" leaves, plus a half-built staging folder.
  fs::rename(checkpoint, checkpoint + ".old");
  fs::create_directories(checkpoint + ".tmp-999999");
  write_raw_file(checkpoint + ".tmp-999999/a", "half");

  EXPECT_EQ(find_complete_directory(checkpoint), checkpoint + ".old");
  EXPECT_EQ(read_raw_file(*find_complete_directory(checkpoint) + "/a"), "step 1");

  write_directory_atomic(checkpoint, [](const std::string& staging) { write_raw_file(staging + "/a", "step 2"); });
  EXPECT_EQ(find_complete_directory(checkpoint), checkpoint);
  EXPECT_EQ(read_raw_file(checkpoint + "/a"), "step 2");
  EXPECT_EQ(entries_in(dir.root()), 1u) << "the .old and the stale staging folder are cleaned up";
}

TEST(AtomicDirectory, KilledAfterSecondRenamePrefersNewDirectory) {
  TempDir dir;
  const std::string checkpoint = dir.path("ckpt");
  fs::create_directories(checkpoint + ".old");
  fs::create_directories(checkpoint);
  EXPECT_EQ(find_complete_directory(checkpoint), checkpoint);
}

}  // namespace
}  // namespace lt
