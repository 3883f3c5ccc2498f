#include "io/input_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tensor/error.h"

namespace lt {

InputFile::InputFile(const std::string& path) : path_(path) {
  descriptor_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor_ < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat info {};
  if (::fstat(descriptor_, &info) != 0) {
    const int error = errno;
    ::close(descriptor_);
    fail(path, ": cannot stat: ", std::strerror(error));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(descriptor_);
    fail(path, ": not a regular file", S_ISDIR(info.st_mode) ? " (it is a directory)" : "");
  }
  size_ = static_cast<uint64_t>(info.st_size);
}

InputFile::~InputFile() { ::close(descriptor_); }

void InputFile::read_at(uint64_t offset, void* destination, size_t bytes, const char* what) const {
  if (offset > size_ || bytes > size_ - offset)
    fail(path_, ": file is truncated: ", what, " needs bytes [", offset, ", ", offset + bytes, ") but the file has ",
         size_, " bytes");
  // pread may return fewer bytes than asked (signals, very large requests): loop until done.
  auto* out = static_cast<char*>(destination);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(descriptor_, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(path_, ": read error in ", what, ": ", std::strerror(errno));
    if (got == 0) fail(path_, ": file shrank while reading ", what, " (", offset + done, " of ", size_, " bytes)");
    done += static_cast<size_t>(got);
  }
}

std::string InputFile::read_all() const {
  std::string contents(size_, '\0');
  read_at(0, contents.data(), contents.size(), "the contents");
  return contents;
}

MappedFile::MappedFile(const InputFile& file) : path_(file.path()), size_(file.size()) {
  if (size_ == 0) return;
  // The mapping outlives the descriptor: closing the file later leaves its pages reachable.
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.descriptor(), 0);
  if (mapped == MAP_FAILED) fail(path_, ": cannot map ", size_, " bytes: ", std::strerror(errno));
  bytes_ = static_cast<const uint8_t*>(mapped);
}

void MappedFile::advise_random_access() const {
  if (bytes_ != nullptr) ::madvise(const_cast<uint8_t*>(bytes_), size_, MADV_RANDOM);  // advice only: ignore failure
}

MappedFile::~MappedFile() {
  if (bytes_ != nullptr) ::munmap(const_cast<uint8_t*>(bytes_), size_);
}

std::string read_file(const std::string& path) { return InputFile(path).read_all(); }

}  // namespace lt
