// Test helpers for file formats: a scratch folder that cleans up after itself, raw file writes for
// building malformed inputs, and a check that an error is one line naming what it should.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tensor/error.h"

namespace lt::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "lingtrain-test-XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
    root_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path(const std::string& name) const { return (std::filesystem::path(root_) / name).string(); }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

// Plain (non-atomic) write: the tests use it to plant exactly the bytes they want, broken ones included.
inline void write_raw_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "could not write " << path;
}

inline std::string read_raw_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs fn and expects an lt::Error whose message is one line containing every fragment (typically the
// file's path and the words that name the problem).
template <class Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected an lt::Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message spans several lines: " << message;
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "message \"" << message << "\" lacks \"" << fragment << "\"";
  }
}
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  expect_error(std::forward<Fn>(fn), std::vector<std::string>(fragments));
}

}  // namespace lt::test
