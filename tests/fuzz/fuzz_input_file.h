// The readers under fuzz take a path (they read with pread through io/input_file.h and never hold a
// whole file in memory), so each input is written to one scratch file per process and read back from
// there. /dev/shm keeps the write off the disk where it exists.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace lt::fuzz {

inline const std::string& scratch_path() {
  static const std::string path = [] {
    const std::filesystem::path folder =
        std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm") : std::filesystem::temp_directory_path();
    return (folder / ("lingtrain-fuzz-" + std::to_string(::getpid()))).string();
  }();
  return path;
}

// Replaces the scratch file's contents with the fuzzer's input and returns its path.
inline const std::string& write_input(const uint8_t* data, size_t size) {
  std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) __builtin_trap();  // the harness itself is broken, not the reader
  return scratch_path();
}

}  // namespace lt::fuzz
