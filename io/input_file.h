// A file opened for reading, with every failure (missing file, a directory, a short read) turned into
// one lt::Error line that names the file. The binary readers (safetensors, token shards) read ranges
// of it with read_at, so a multi-gigabyte file never has to sit in memory twice.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace lt {

class InputFile {
 public:
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }

  // Reads exactly `bytes` bytes starting at `offset`. `what` names the part being read for the error
  // ("path: file is truncated: <what> needs bytes [a, b) but the file has n bytes").
  void read_at(uint64_t offset, void* destination, size_t bytes, const char* what) const;
  std::string read_all() const;
  int descriptor() const { return descriptor_; }

 private:
  std::string path_;
  int descriptor_ = -1;
  uint64_t size_ = 0;
};

// A file's bytes mapped read-only into memory: token shards of any size are read in place, and a process
// touches (and the kernel pages in) only the ranges it reads, so each rank of a run reads only its windows.
class MappedFile {
 public:
  explicit MappedFile(const InputFile& file);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  const uint8_t* bytes() const { return bytes_; }
  // Tells the kernel the bytes will be read at random places (a training set's shuffled windows): a page
  // fault then brings in that page alone, not the read-ahead and neighbours a sequential reader wants.
  void advise_random_access() const;

 private:
  std::string path_;
  uint64_t size_ = 0;
  const uint8_t* bytes_ = nullptr;  // null for an empty file (mmap cannot map zero bytes)
};

// The whole contents of a file.
std::string read_file(const std::string& path);

}  // namespace lt
