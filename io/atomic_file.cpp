#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "tensor/error.h"

namespace lt {

namespace fs = std::filesystem;

namespace {

std::string temporary_name(const std::string& path) { return path + ".tmp-" + std::to_string(::getpid()); }

// "runs/ckpt/" names the same folder as "runs/ckpt"; the sibling names (".old", ".tmp-<pid>") need
// the form without the slash.
std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string parent_directory(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// fsync of a file or a directory opened read-only; `target` is what the error names.
void sync_path(const std::string& path, bool is_directory, const std::string& target) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (is_directory ? O_DIRECTORY : 0));
  if (descriptor < 0) fail(target, ": cannot open ", path, " to sync it: ", std::strerror(errno));
  const int result = ::fsync(descriptor);
  const int error = errno;
  ::close(descriptor);
  // Some filesystems (certain FUSE and network mounts) cannot sync a directory and say EINVAL; the
  // rename is then as durable as that filesystem makes it, which is all anyone can get there.
  if (result != 0 && !(is_directory && error == EINVAL))
    fail(target, ": cannot sync ", path, ": ", std::strerror(error));
}

void sync_tree(const std::string& root, const std::string& target) {
  std::error_code error;
  for (fs::recursive_directory_iterator it(root, error), end; !error && it != end; it.increment(error)) {
    const fs::file_type type = it->symlink_status(error).type();
    if (error) break;
    if (type == fs::file_type::regular) sync_path(it->path().string(), false, target);
    else if (type == fs::file_type::directory) sync_path(it->path().string(), true, target);
  }
  if (error) fail(target, ": cannot list ", root, ": ", error.message());
  sync_path(root, true, target);
}

void rename_or_fail(const std::string& from, const std::string& to, const std::string& target) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    fail(target, ": cannot rename ", from, " to ", to, ": ", std::strerror(errno));
}

void remove_tree_or_fail(const std::string& path, const std::string& target) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) fail(target, ": cannot remove ", path, ": ", error.message());
}

// Staging folders "<dir>.tmp-<pid>" left by writers that were killed: never complete, safe to drop
// because there is one writer per directory.
void remove_stale_staging(const std::string& dir) {
  const std::string parent = parent_directory(dir);
  const std::string prefix = fs::path(dir).filename().string() + ".tmp-";
  std::vector<std::string> stale;
  std::error_code error;
  for (fs::directory_iterator it(parent, error), end; !error && it != end; it.increment(error)) {
    if (it->path().filename().string().starts_with(prefix)) stale.push_back(it->path().string());
  }
  for (const std::string& path : stale) remove_tree_or_fail(path, dir);
}

}  // namespace

namespace {

// The buffer: a whole number of blocks for any device (4 KiB covers 512-byte and 4K-sector disks).
constexpr size_t kDirectAlignment = 4096;
constexpr size_t kSinkBufferBytes = size_t{8} << 20;

}  // namespace

void FileSink::FreeAligned::operator()(char* p) const { std::free(p); }

FileSink::FileSink(int descriptor, bool direct, const std::string& path)
    : descriptor_(descriptor),
      direct_(direct),
      path_(path),
      buffer_(static_cast<char*>(std::aligned_alloc(kDirectAlignment, kSinkBufferBytes))) {
  if (!buffer_) fail(path_, ": out of memory for the write buffer");
}

void FileSink::write(const void* data, size_t bytes) {
  const char* from = static_cast<const char*>(data);
  bytes_written_ += bytes;
  while (bytes > 0) {
    const size_t n = std::min(bytes, kSinkBufferBytes - held_);
    std::memcpy(buffer_.get() + held_, from, n);
    held_ += n;
    from += n;
    bytes -= n;
    if (held_ == kSinkBufferBytes) write_out(held_);
  }
}

void FileSink::write_out(size_t bytes) {
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::write(descriptor_, buffer_.get() + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EINVAL && direct_) {
      // A filesystem that took O_DIRECT at open but not this write: ordinary writes from here on.
      direct_ = false;
      if (::fcntl(descriptor_, F_SETFL, ::fcntl(descriptor_, F_GETFL) & ~O_DIRECT) != 0)
        fail(path_, ": cannot leave direct I/O: ", std::strerror(errno));
      continue;
    }
    if (n <= 0)
      fail(path_, ": write failed after ", bytes_on_disk_ + done, " bytes: ", std::strerror(n < 0 ? errno : EIO));
    done += static_cast<size_t>(n);
  }
  bytes_on_disk_ += bytes;
  held_ = 0;
}

void FileSink::finish() {
  if (held_ == 0) return;
  if (!direct_) {
    write_out(held_);
    return;
  }
  // A direct write is whole blocks: the tail goes out padded, and the file is cut back to its length.
  const size_t padded = (held_ + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  std::memset(buffer_.get() + held_, 0, padded - held_);
  write_out(padded);
  bytes_on_disk_ = bytes_written_;
  if (::ftruncate(descriptor_, static_cast<off_t>(bytes_written_)) != 0)
    fail(path_, ": cannot set its length: ", std::strerror(errno));
}

void write_file_atomic(const std::string& path, const std::function<void(FileSink&)>& write_contents) {
  const std::string temporary = temporary_name(path);
  const int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
  bool direct = true;
  int descriptor = ::open(temporary.c_str(), flags | O_DIRECT, 0644);
  if (descriptor < 0 && errno == EINVAL) {  // a filesystem without direct I/O
    direct = false;
    descriptor = ::open(temporary.c_str(), flags, 0644);
  }
  if (descriptor < 0) fail(path, ": cannot create ", temporary, ": ", std::strerror(errno));
  try {
    FileSink sink(descriptor, direct, path);
    write_contents(sink);
    sink.finish();
    // fsync moves the bytes to the disk: only then may the rename publish them, or a power loss could
    // leave <path> pointing at an empty or partial file.
    if (::fsync(descriptor) != 0) fail(path, ": cannot sync ", temporary, ": ", std::strerror(errno));
    const int closing = descriptor;
    descriptor = -1;
    if (::close(closing) != 0) fail(path, ": cannot close ", temporary, ": ", std::strerror(errno));
    rename_or_fail(temporary, path, path);
  } catch (...) {
    if (descriptor >= 0) ::close(descriptor);
    std::remove(temporary.c_str());
    throw;
  }
  sync_path(parent_directory(path), true, path);
}

void write_file_atomic(const std::string& path, std::string_view contents) {
  write_file_atomic(path, [&](FileSink& sink) { sink.write(contents); });
}

void write_directory_atomic(const std::string& dir_path, const std::function<void(const std::string&)>& fill,
                            const std::function<void(const std::string&)>& retire) {
  const std::string dir = without_trailing_slashes(dir_path);
  const std::string staging = temporary_name(dir);
  const std::string previous = dir + ".old";
  const std::string parent = parent_directory(dir);
  auto retire_previous = [&] {
    if (retire) retire(previous);
    else remove_tree_or_fail(previous, dir);
  };

  remove_stale_staging(dir);
  std::error_code error;
  fs::create_directories(staging, error);
  if (error) fail(dir, ": cannot create ", staging, ": ", error.message());
  try {
    fill(staging);
    sync_tree(staging, dir);
  } catch (...) {
    fs::remove_all(staging, error);
    throw;
  }

  if (fs::exists(dir, error)) {
    if (fs::exists(previous, error)) retire_previous();
    rename_or_fail(dir, previous, dir);
    sync_path(parent, true, dir);
  }
  rename_or_fail(staging, dir, dir);
  sync_path(parent, true, dir);
  // The new directory is complete and published; a leftover "<dir>.old" (if this fails here) is
  // retired by the next write, so a failure now must not report the save itself as failed.
  try {
    if (fs::exists(previous, error)) retire_previous();
  } catch (const std::exception&) {
  }
}

std::optional<std::string> find_complete_directory(const std::string& dir_path) {
  const std::string dir = without_trailing_slashes(dir_path);
  std::error_code error;
  if (fs::is_directory(dir, error)) return dir;
  if (fs::is_directory(dir + ".old", error)) return dir + ".old";
  return std::nullopt;
}

}  // namespace lt
