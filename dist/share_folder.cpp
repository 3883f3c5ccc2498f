#include "dist/share_folder.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <vector>

#include "tensor/error.h"

namespace lt {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kPieceBytes = int64_t{64} << 20;

struct SharedFile {
  std::string relative;
  int64_t bytes = 0;
};

// root's files, one "bytes path" line each, in a fixed order.
std::string manifest_of(const std::string& folder) {
  std::vector<SharedFile> files;
  std::error_code error;
  for (fs::recursive_directory_iterator it(folder, error), end; !error && it != end; it.increment(error))
    if (it->is_regular_file())
      files.push_back({fs::relative(it->path(), folder).string(), static_cast<int64_t>(it->file_size())});
  if (error) fail(folder, ": cannot list it to send it to the other ranks: ", error.message());
  std::sort(files.begin(), files.end(),
            [](const SharedFile& a, const SharedFile& b) { return a.relative < b.relative; });
  std::string manifest;
  for (const SharedFile& f : files) manifest += std::to_string(f.bytes) + " " + f.relative + "\n";
  return manifest;
}

std::vector<SharedFile> parse_manifest(const std::string& manifest) {
  std::vector<SharedFile> files;
  std::istringstream lines(manifest);
  for (SharedFile f; lines >> f.bytes && lines.get() == ' ' && std::getline(lines, f.relative);) files.push_back(f);
  return files;
}

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

}  // namespace

void broadcast_text(Communicator& comm, std::string& text, int root) {
  Tensor length = Tensor::full({1}, static_cast<double>(text.size()), DType::I64);
  comm.broadcast(length, root);
  const int64_t bytes = length.to_vector<int64_t>()[0];
  Tensor words = Tensor::zeros({(bytes + 7) / 8}, DType::I64);
  if (comm.rank() == root) std::memcpy(words.raw_data(), text.data(), text.size());
  comm.broadcast(words, root);
  text.assign(static_cast<const char*>(words.raw_data()), static_cast<size_t>(bytes));
}

std::string share_folder(Communicator& comm, int root, const std::string& folder, const std::string& local) {
  const bool sending = comm.rank() == root;
  std::string manifest = sending ? manifest_of(folder) : "";
  broadcast_text(comm, manifest, root);
  if (!sending) {
    fs::remove_all(local);
    fs::create_directories(local);
  }
  Tensor piece = Tensor::empty({kPieceBytes / 8}, DType::I64);
  char* piece_bytes = static_cast<char*>(piece.raw_data());
  for (const SharedFile& f : parse_manifest(manifest)) {
    const std::string path = (sending ? folder : local) + "/" + f.relative;
    if (!sending) fs::create_directories(fs::path(path).parent_path());
    const std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), sending ? "rb" : "wb"));
    if (!file) fail(path, ": cannot open it (", sending ? "to send" : "to receive", " it): ", std::strerror(errno));
    for (int64_t at = 0; at < f.bytes; at += kPieceBytes) {
      const int64_t n = std::min(kPieceBytes, f.bytes - at);
      if (sending && std::fread(piece_bytes, 1, static_cast<size_t>(n), file.get()) != static_cast<size_t>(n))
        fail(path, ": read failed at byte ", at, " while sending it to the other ranks");
      Tensor part = piece.narrow(0, (n + 7) / 8);
      comm.broadcast(part, root);
      if (!sending && std::fwrite(piece_bytes, 1, static_cast<size_t>(n), file.get()) != static_cast<size_t>(n))
        fail(path, ": write failed at byte ", at, ": ", std::strerror(errno));
    }
    if (!sending && std::fflush(file.get()) != 0) fail(path, ": write failed: ", std::strerror(errno));
  }
  return sending ? folder : local;
}

}  // namespace lt
