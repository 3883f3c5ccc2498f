#include <gtest/gtest.h>

#include "io/json.h"
#include "tests/io/temp_dir.h"

namespace lt {
namespace {

using test::expect_error;
using test::TempDir;
using test::write_raw_file;

TEST(Json, ParseErrorNamesFileLineAndColumn) {
  TempDir dir;
  const std::string path = dir.path("config.json");
  write_raw_file(path, "{\n  \"hidden_size\": 64,\n  \"tie\": tru\n}\n");
  expect_error([&] { read_json_file(path); }, {path + ": invalid JSON at line 3, column ", "(byte "});
  write_raw_file(path, "");
  expect_error([&] { read_json_file(path); }, {path + ": invalid JSON at line 1, column 1"});
}

// A number beyond double's range parses as valid syntax, so nlohmann throws out_of_range rather than
// parse_error; it must still come out as one clean line (found by fuzzing the safetensors header).
TEST(Json, NumberOverflowIsACleanError) {
  expect_error([] { parse_json("{\"a\": 1E400}", "config.json"); },
               {"config.json: invalid JSON: number overflow parsing '1E400'"});
  expect_error([] { parse_json("[-666666666666666E6666666666666606666666666]", "header"); },
               {"header: invalid JSON: number overflow"});
}

TEST(Json, MissingFileNamesTheFile) {
  TempDir dir;
  const std::string path = dir.path("absent.json");
  expect_error([&] { read_json_file(path); }, {path, "cannot open"});
  expect_error([&] { read_json_file(dir.root()); }, {dir.root(), "directory"});
}

TEST(Json, TypedGettersAndDefaults) {
  const Json value = parse_json(R"({"hidden_size": 64, "rope_theta": 10000, "eps": 1e-6, "norm_head": true,
                                    "model_type": "bailing_moe", "rope_scaling": null, "big": 5000000000,
                                    "rope": {"factor": 2.0}})",
                                "config.json");
  const JsonObject config(value, "config.json");
  EXPECT_EQ(config.get<int64_t>("hidden_size"), 64);
  EXPECT_EQ(config.get<int>("hidden_size"), 64);
  EXPECT_EQ(config.get<double>("rope_theta"), 10000.0);
  EXPECT_DOUBLE_EQ(config.get<double>("eps"), 1e-6);
  EXPECT_TRUE(config.get<bool>("norm_head"));
  EXPECT_EQ(config.get<std::string>("model_type"), "bailing_moe");
  EXPECT_EQ(config.get<int64_t>("big"), 5000000000);
  EXPECT_EQ(config.get("num_layers", 4), 4);
  EXPECT_EQ(config.get("hidden_size", 8), 64);
  EXPECT_FALSE(config.has("rope_scaling")) << "null means unset";
  EXPECT_EQ(config.get("rope_scaling", std::string("none")), "none");
  EXPECT_EQ(config.object("rope").get<double>("factor"), 2.0);
}

TEST(Json, WrongTypeIsOneClearLine) {
  const Json value = parse_json(R"({"hidden_size": "64", "layers": 2.5, "flag": 1, "name": 3,
                                    "big": 5000000000, "rope": {"factor": "x"}, "list": [1]})",
                                "config.json");
  const JsonObject config(value, "config.json");
  try {
    config.get<int64_t>("hidden_size");
    FAIL();
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "config.json: key 'hidden_size' must be an integer, got string");
  }
  expect_error([&] { config.get<int64_t>("layers"); }, {"config.json: key 'layers' must be an integer, got non-integer number 2.5"});
  expect_error([&] { config.get<bool>("flag"); }, {"config.json: key 'flag' must be true or false, got number 1"});
  expect_error([&] { config.get<std::string>("name"); }, {"config.json: key 'name' must be a string"});
  expect_error([&] { config.get<int>("big"); }, {"config.json: key 'big' is out of range"});
  expect_error([&] { config.get<int64_t>("absent"); }, {"config.json: missing key 'absent'"});
  expect_error([&] { config.get("hidden_size", int64_t{1}); }, {"key 'hidden_size' must be an integer"});
  expect_error([&] { config.object("rope").get<double>("factor"); }, {"config.json: key 'rope.factor' must be a number"});
  expect_error([&] { config.object("list"); }, {"config.json: key 'list' must be an object, got array"});
  expect_error([&] { JsonObject(parse_json("[1, 2]", "config.json"), "config.json"); },
               {"config.json: expected a JSON object at the top level, got array"});
}

TEST(Json, WriteReadRoundTrip) {
  TempDir dir;
  const std::string path = dir.path("metrics.json");
  const Json value = {{"loss", 2.5}, {"step", 10}, {"name", "run"}};
  write_json_file(path, value);
  EXPECT_EQ(read_json_file(path), value);
  EXPECT_EQ(test::read_raw_file(path).back(), '\n');
}

}  // namespace
}  // namespace lt
