#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

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

// Direct writes are whole blocks from an 8 MiB buffer: lengths around a block and around the buffer come
// back exactly (the padded tail cut off), in pieces of any size.
TEST(AtomicFile, LengthsAroundBlocksAndTheBufferComeBackExactly) {
  TempDir dir;
  const std::string path = dir.path("blob.bin");
  for (size_t length : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, (size_t{8} << 20) - 1,
                        size_t{8} << 20, (size_t{8} << 20) + 4099, size_t{20} << 20}) {
    std::string bytes(length, '\0');
    for (size_t i = 0; i < length; ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
    write_file_atomic(path, [&](FileSink& sink) {
      for (size_t at = 0; at < length; at += 3000001)
        sink.write(bytes.data() + at, std::min<size_t>(3000001, length - at));
    });
    EXPECT_EQ(fs::file_size(path), length);
    EXPECT_TRUE(read_raw_file(path) == bytes) << length << " bytes";
  }
  EXPECT_EQ(entries_in(dir.root()), 1u);
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

// The directory a write replaces goes to `retire` (a history of checkpoints), a stale "<dir>.old" too.
TEST(AtomicDirectory, ReplacedDirectoryGoesToRetire) {
  TempDir dir;
  const std::string checkpoint = dir.path("ckpt");
  std::vector<std::string> retired;
  auto keep = [&](const std::string& previous) {
    const std::string kept = dir.path("kept-" + std::to_string(retired.size()));
    fs::rename(previous, kept);
    retired.push_back(read_raw_file(kept + "/step"));
  };
  for (const char* step : {"1", "2", "3"})
    write_directory_atomic(
        checkpoint, [&](const std::string& staging) { write_raw_file(staging + "/step", step); }, keep);
  EXPECT_EQ(retired, (std::vector<std::string>{"1", "2"}));
  EXPECT_EQ(read_raw_file(checkpoint + "/step"), "3");
  EXPECT_FALSE(fs::exists(checkpoint + ".old"));
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
