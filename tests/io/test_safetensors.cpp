#include <gtest/gtest.h>

#include <cstring>

#include "io/json.h"
#include "io/safetensors.h"
#include "tensor/random.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

using test::expect_error;
using test::read_raw_file;
using test::TempDir;
using test::write_raw_file;

std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &value, 8);
  return bytes;
}

// A file with this exact header text (no padding added) and data section.
std::string file_bytes(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Safetensors, RoundTripEveryDtype) {
  TempDir dir;
  const std::string path = dir.path("model.safetensors");
  Rng rng(7);
  const NamedTensors tensors = {
      {"model.word_embeddings.weight", Tensor::randn({5, 3}, rng, 1.0, DType::BF16)},
      {"lm_head.weight", Tensor::randn({5, 3}, rng)},
      {"model.norm.weight", Tensor::randn({3}, rng, 1.0, DType::F64)},
      {"ids", Tensor::from_vector<int32_t>({2, 2}, {1, -2, 3, 2147483647})},
      {"offsets", Tensor::from_vector<int64_t>({3}, {-1, 0, int64_t{1} << 40})},
      {"scalar", Tensor::full({}, 0.25)},
      {"empty", Tensor::zeros({0, 4})},
  };
  save_safetensors(path, tensors, {{"step", "12"}});
  const SafetensorsFile file = load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) EXPECT_TRUE(same_bytes(file.get(name), tensor)) << name;
  EXPECT_EQ(file.metadata.at("step"), "12");
  EXPECT_EQ(file.metadata.at("format"), "pt") << "transformers requires a format entry";

  const Tensor head = load_safetensors_tensor(path, "lm_head.weight", {5, 3}, DType::F32);
  EXPECT_TRUE(same_bytes(head, tensors[1].second));
}

// The exact bytes of the safetensors library's own test "test_serialization_forced_alignement".
TEST(Safetensors, BytesMatchThePythonLibrary) {
  TempDir dir;
  const std::string path = dir.path("a.safetensors");
  save_safetensors(path, {{"attn0", Tensor::from_vector<float>({1, 1, 2, 3}, {0, 1, 2, 3, 4, 5})}});
  const std::string header = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  std::string data(24, '\0');
  const float values[6] = {0, 1, 2, 3, 4, 5};
  std::memcpy(data.data(), values, 24);
  EXPECT_EQ(read_raw_file(path), le64(72) + header + std::string(72 - header.size(), ' ') + data);

  save_safetensors(path, {});
  EXPECT_EQ(read_raw_file(path), le64(8) + "{}      ");
}

TEST(Safetensors, HeaderLayoutIsWhatReadersExpect) {
  TempDir dir;
  const std::string path = dir.path("mixed.safetensors");
  Rng rng(3);
  save_safetensors(path,
                   {{"b.bf16", Tensor::randn({3}, rng, 1.0, DType::BF16)},
                    {"a.bf16", Tensor::randn({1}, rng, 1.0, DType::BF16)},
                    {"z.f32", Tensor::randn({2, 1}, rng)},
                    {"c.i32", Tensor::from_vector<int32_t>({1}, {4})},
                    {"y.f64", Tensor::randn({1}, rng, 1.0, DType::F64)},
                    {"x.i64", Tensor::from_vector<int64_t>({1}, {9})}},
                   {{"note", "hi"}});
  const std::string bytes = read_raw_file(path);
  uint64_t header_length;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);
  const std::string header = bytes.substr(8, header_length);
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}')) << "padding is spaces after the JSON";
  const size_t first_space = header.find(' ');
  EXPECT_TRUE(first_space == std::string::npos || first_space == header.find_last_not_of(' ') + 1)
      << "compact JSON, as serde_json writes it";

  // Keys: __metadata__ first, then by dtype alignment (I64, F64, F32, I32, BF16), then by name.
  const std::vector<std::string> order = {"__metadata__", "x.i64", "y.f64", "z.f32", "c.i32", "a.bf16", "b.bf16"};
  size_t last = 0;
  for (const std::string& key : order) {
    const size_t at = header.find("\"" + key + "\"");
    ASSERT_NE(at, std::string::npos) << key;
    EXPECT_GT(at, last) << key << " is out of order";
    last = at;
  }
  EXPECT_NE(header.find(R"("__metadata__":{"format":"pt","note":"hi"})"), std::string::npos);

  // Offsets are contiguous from 0 in key order, aligned to each element size, and end at the file end.
  const Json json = parse_json(header, path);
  uint64_t expected_begin = 0;
  for (size_t i = 1; i < order.size(); ++i) {
    const Json& entry = json.at(order[i]);
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    EXPECT_EQ(begin, expected_begin) << order[i];
    const std::string dtype = entry["dtype"];
    const uint64_t element = dtype == "BF16" ? 2 : (dtype == "F32" || dtype == "I32") ? 4 : 8;
    EXPECT_EQ((8 + header_length + begin) % element, 0u) << order[i] << " data is misaligned";
    expected_begin = end;
  }
  EXPECT_EQ(8 + header_length + expected_begin, bytes.size());
}

TEST(Safetensors, ExpectedShapeAndDtypeMismatchesAreClear) {
  TempDir dir;
  const std::string path = dir.path("model.safetensors");
  save_safetensors(path, {{"lm_head.weight", Tensor::zeros({8, 4})}});
  try {
    load_safetensors_tensor(path, "lm_head.weight", {16, 4}, DType::F32);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()), path + ": tensor 'lm_head.weight' has shape [8, 4], expected [16, 4]");
  }
  expect_error([&] { load_safetensors_tensor(path, "lm_head.weight", {8, 4}, DType::BF16); },
               {path, "tensor 'lm_head.weight' has dtype f32, expected bf16"});
  expect_error([&] { load_safetensors_tensor(path, "model.norm.weight", {4}, DType::F32); },
               {path, "no tensor named 'model.norm.weight'"});
  const SafetensorsFile file = load_safetensors(path);
  expect_error([&] { file.get("lm_head.weight", {4, 8}, DType::F32); }, {path, "has shape [8, 4], expected [4, 8]"});
  expect_error([&] { file.get("missing"); }, {path, "no tensor named 'missing'"});
}

TEST(Safetensors, SaveRejectsBadNames) {
  TempDir dir;
  const std::string path = dir.path("bad.safetensors");
  expect_error([&] { save_safetensors(path, {{"w", Tensor::zeros({1})}, {"w", Tensor::zeros({2})}}); },
               {path, "'w' appears twice"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", Tensor::zeros({1})}}); }, {path, "reserved"});
  expect_error([&] { save_safetensors(path, {{"w", Tensor()}}); }, {path, "'w' is undefined"});
  EXPECT_FALSE(std::filesystem::exists(path));
}

struct MalformedCase {
  const char* what;
  std::string bytes;
  std::string fragment;
};

TEST(Safetensors, EveryMalformedFileIsOneClearError) {
  const std::string eight_floats(32, '\0');
  const std::string good = R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]}})";
  const std::vector<MalformedCase> cases = {
      {"shorter than the length field", "abcde", "shorter than the 8-byte header length"},
      {"header length beyond the file", le64(500) + "{}", "header length 500 runs past the end of the file"},
      {"header length absurd", le64(uint64_t{1} << 40) + "{}", "exceeds the 100000000-byte limit"},
      {"malformed JSON", file_bytes(R"({"w":{"dtype":"F32",)", ""), "header: invalid JSON at line 1, column 21"},
      {"header not an object", file_bytes("[1,2]", ""), "header must be a JSON object"},
      {"unknown dtype", file_bytes(R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", "abcd"),
       "tensor 'w' has dtype F16, which lingtrain does not read"},
      {"missing data_offsets", file_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"), "tensor 'w' has no 'data_offsets'"},
      {"negative dimension", file_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"),
       "'shape' must be a list of non-negative integers"},
      {"three offsets", file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "abcd"),
       "'data_offsets' must be two non-negative integers"},
      {"offsets reversed", file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcd"),
       "with end before begin"},
      {"size not dtype times shape", file_bytes(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", eight_floats),
       "(20 bytes) but F32 [2, 3] needs 24 bytes"},
      {"shape overflows", file_bytes(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", "12345678"),
       "shape too large"},
      {"data truncated", file_bytes(good, eight_floats.substr(0, 20)), "file is truncated: tensor 'w' needs data bytes [0, 32)"},
      {"offsets beyond the data", file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[40,44]}})", eight_floats),
       "belong to no tensor"},
      {"overlapping tensors",
       file_bytes(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                  eight_floats),
       "tensor 'b' data [8, 24) overlaps tensor 'a' data [0, 16)"},
      {"gap between tensors",
       file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})",
                  eight_floats.substr(0, 24)),
       "bytes [8, 16) of the data section belong to no tensor"},
      {"trailing bytes", file_bytes(good, eight_floats + "xx"), "2 trailing bytes after the last tensor's data"},
      {"metadata not strings", file_bytes(R"({"__metadata__":{"step":3}})", ""), "__metadata__ key 'step' must be a string"},
      {"tensor entry not an object", file_bytes(R"({"w":[1,2]})", ""), "tensor 'w' must be described by an object"},
      // Found by tests/fuzz/fuzz_safetensors: nlohmann throws out_of_range, not parse_error, for this.
      {"number beyond a double", file_bytes(R"({"w":{"dtype":"F32","shape":[1E400],"data_offsets":[0,4]}})", "abcd"),
       "header: invalid JSON: number overflow parsing '1E400'"},
  };
  TempDir dir;
  const std::string path = dir.path("model.safetensors");
  for (const MalformedCase& malformed : cases) {
    SCOPED_TRACE(malformed.what);
    write_raw_file(path, malformed.bytes);
    expect_error([&] { load_safetensors(path); }, {path, malformed.fragment});
    expect_error([&] { read_safetensors_header(path); }, {path, malformed.fragment});
  }
  expect_error([&] { load_safetensors(dir.path("absent.safetensors")); }, {dir.path("absent.safetensors"), "cannot open"});
}

TEST(Safetensors, TruncatedCopyOfARealFileFails) {
  TempDir dir;
  const std::string path = dir.path("model.safetensors");
  Rng rng(1);
  save_safetensors(path, {{"a", Tensor::randn({16, 16}, rng)}, {"b", Tensor::randn({4}, rng, 1.0, DType::BF16)}});
  const std::string bytes = read_raw_file(path);
  write_raw_file(path, bytes.substr(0, bytes.size() - 3));
  expect_error([&] { load_safetensors(path); }, {path, "file is truncated"});
}

}  // namespace
}  // namespace lt
