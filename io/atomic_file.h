// Atomic writes: whatever moment the writer is killed at (crash, OOM kill, power loss), a reader sees
// either the previous complete file or directory or the new complete one, never a half-written mix.
//
// One file: the bytes go to "<path>.tmp-<pid>", are flushed and fsync'ed, the temporary is renamed over
// <path> (rename within one directory is atomic on POSIX filesystems), and the directory is fsync'ed so
// that the rename itself survives a power loss.
//
// A directory (a checkpoint: config.json + model.safetensors + optimizer state): it is built complete
// as "<dir>.tmp-<pid>", every file in it and the folder itself are fsync'ed, then swapped into place:
//   1. if <dir> exists: remove a stale "<dir>.old" (harmless: <dir> is complete), rename <dir> to
//      "<dir>.old", fsync the parent;
//   2. rename "<dir>.tmp-<pid>" to <dir>, fsync the parent;
//   3. remove "<dir>.old".
// A crash before step 1 leaves <dir> untouched; between 1 and 2 only "<dir>.old" exists and it is the
// previous complete directory; after 2, <dir> is the new complete one. So at every moment <dir>, or else
// "<dir>.old", holds a complete directory: find_complete_directory says which. Staging folders
// ("*.tmp-<pid>") are never complete by construction and are removed by the next write.
//
// One writer per path at a time (in a multi-process run, rank 0 writes the checkpoint).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace lt {

// The destination handed to the body of write_file_atomic. Every write is checked, so a full disk is
// an lt::Error naming the file rather than a silently short file.
class FileSink {
 public:
  FileSink(std::FILE* file, const std::string& path) : file_(file), path_(path) {}
  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  uint64_t bytes_written() const { return bytes_written_; }

 private:
  std::FILE* file_;
  const std::string& path_;  // the target, named in errors
  uint64_t bytes_written_ = 0;
};

// Writes `path` from what write_contents puts into the sink. If write_contents throws, the temporary
// is removed, <path> keeps its previous contents, and the exception propagates.
void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& write_contents);
void write_file_atomic(const std::string& path, std::string_view contents);

// Builds a directory with fill(staging_dir), which writes its files into staging_dir with plain or
// atomic writes (everything in it is fsync'ed afterwards), then swaps it into place as described above.
// If fill throws, the staging folder is removed and <dir> (or "<dir>.old") is untouched.
void write_directory_atomic(const std::string& dir, const std::function<void(const std::string& staging_dir)>& fill);

// Where the last complete version of a directory written by write_directory_atomic lives: <dir> if it
// exists; else "<dir>.old" when a writer was killed between its two renames, and a loader should then
// read "<dir>.old" as it is (not rename it back: the next write_directory_atomic completes the swap);
// nullopt when neither exists (nothing was ever written).
std::optional<std::string> find_complete_directory(const std::string& dir);

}  // namespace lt
