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
//   3. remove "<dir>.old" (or hand it to the caller's `retire`, which moves it into a history of
//      checkpoints).
// A crash before step 1 leaves <dir> untouched; between 1 and 2 only "<dir>.old" exists and it is the
// previous complete directory; after 2, <dir> is the new complete one. So at every moment <dir>, or else
// "<dir>.old", holds a complete directory: find_complete_directory says which. Staging folders
// ("*.tmp-<pid>") are never complete by construction and are removed by the next write.
//
// One writer per path at a time (in a multi-process run, rank 0 writes the checkpoint).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace lt {

// The destination handed to the body of write_file_atomic. Every write is checked, so a full disk is
// an lt::Error naming the file rather than a silently short file.
//
// The bytes bypass the page cache where the filesystem allows it (O_DIRECT): they gather in an aligned
// buffer written out a whole number of blocks at a time, and the file is cut back to its length at the
// end. Copying a checkpoint into the page cache and writing it back cost 2.6 s of kernel time per GB on
// the 2-vCPU VM (0.1 s direct), time taken from the training threads, with the write in the background
// or not. Where O_DIRECT is refused (tmpfs) the same buffer feeds ordinary writes.
class FileSink {
 public:
  FileSink(int descriptor, bool direct, const std::string& path);
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;
  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  uint64_t bytes_written() const { return bytes_written_; }
  // Writes out what the buffer holds and gives the file its exact length.
  void finish();

 private:
  void write_out(size_t bytes);  // the first `bytes` of the buffer

  struct FreeAligned {
    void operator()(char* p) const;
  };
  int descriptor_;
  bool direct_;
  const std::string& path_;  // the target, named in errors
  std::unique_ptr<char, FreeAligned> buffer_;
  size_t held_ = 0;  // bytes in the buffer
  uint64_t bytes_written_ = 0, bytes_on_disk_ = 0;
};

// Writes `path` from what write_contents puts into the sink. If write_contents throws, the temporary
// is removed, <path> keeps its previous contents, and the exception propagates.
void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& write_contents);
void write_file_atomic(const std::string& path, std::string_view contents);

// Builds a directory with fill(staging_dir), which writes its files into staging_dir with plain or
// atomic writes (everything in it is fsync'ed afterwards), then swaps it into place as described above.
// If fill throws, the staging folder is removed and <dir> (or "<dir>.old") is untouched. retire, when given,
// takes the previous complete directory ("<dir>.old", also one a killed writer left behind) instead of its
// removal: it must move it away (a rename) or remove it; an error it throws after the swap is dropped, as
// a failed removal is (the new directory is published; the next write retires what is left).
void write_directory_atomic(const std::string& dir, const std::function<void(const std::string& staging_dir)>& fill,
                            const std::function<void(const std::string& previous)>& retire = {});

// Where the last complete version of a directory written by write_directory_atomic lives: <dir> if it
// exists; else "<dir>.old" when a writer was killed between its two renames, and a loader should then
// read "<dir>.old" as it is (not rename it back: the next write_directory_atomic completes the swap);
// nullopt when neither exists (nothing was ever written).
std::optional<std::string> find_complete_directory(const std::string& dir);

}  // namespace lt
