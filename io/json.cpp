#include "io/json.h"

#include <algorithm>
#include <limits>

#include "io/atomic_file.h"
#include "io/input_file.h"
#include "tensor/error.h"

namespace lt {

namespace {

// nlohmann's message reads "[json.exception.parse_error.101] parse error at line 2, column 5: syntax
// error while parsing ..."; we report the position ourselves and keep only the part after it.
std::string parse_error_detail(const std::string& message) {
  const size_t column = message.find("column ");
  if (column == std::string::npos) return message;
  const size_t colon = message.find(": ", column);
  return colon == std::string::npos ? message : message.substr(colon + 2);
}

// The type as a person reads it in an error; numbers show their value, since "must be an integer, got
// number" would hide that 2048.5 (not "2048") is the problem.
std::string describe(const Json& value) {
  if (value.is_number_float()) return "non-integer number " + value.dump();
  if (value.is_number()) return "number " + value.dump();
  if (value.is_boolean()) return "boolean";
  return value.type_name();
}

}  // namespace

Json parse_json(std::string_view text, const std::string& source) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& error) {
    // error.byte is 1-based: the position of the character that failed to parse.
    const size_t failed_at = std::min<size_t>(error.byte == 0 ? 0 : error.byte - 1, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < failed_at; ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    fail(source, ": invalid JSON at line ", line, ", column ", column, " (byte ", failed_at, "): ",
         parse_error_detail(error.what()));
  } catch (const Json::out_of_range& error) {
    // A number literal too large for a double ("1E400") is syntactically valid, so nlohmann throws
    // out_of_range (406), not parse_error, and gives no position; found by tests/fuzz/fuzz_safetensors.
    const std::string message = error.what();
    const size_t detail = message.find("] ");
    fail(source, ": invalid JSON: ", detail == std::string::npos ? message : message.substr(detail + 2));
  }
}

Json read_json_file(const std::string& path) { return parse_json(read_file(path), path); }

void write_json_file(const std::string& path, const Json& value, int indent) {
  write_file_atomic(path, value.dump(indent) + "\n");
}

JsonObject::JsonObject(const Json& value, std::string source, std::string key_path)
    : value_(value), source_(std::move(source)), key_path_(std::move(key_path)) {
  if (!value_.is_object()) {
    if (key_path_.empty()) fail(source_, ": expected a JSON object at the top level, got ", describe(value_));
    fail(source_, ": key '", key_path_, "' must be an object, got ", describe(value_));
  }
}

std::string JsonObject::key_name(const std::string& key) const {
  return key_path_.empty() ? key : key_path_ + "." + key;
}

bool JsonObject::has(const std::string& key) const {
  const auto it = value_.find(key);
  return it != value_.end() && !it->is_null();
}

template <>
int64_t JsonObject::get<int64_t>(const std::string& key) const {
  if (!has(key)) fail(source_, ": missing key '", key_name(key), "'");
  const Json& value = value_.at(key);
  if (!value.is_number_integer()) fail(source_, ": key '", key_name(key), "' must be an integer, got ", describe(value));
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail(source_, ": key '", key_name(key), "' is out of range: ", value.dump());
  return value.get<int64_t>();
}

template <>
int JsonObject::get<int>(const std::string& key) const {
  const int64_t value = get<int64_t>(key);
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
    fail(source_, ": key '", key_name(key), "' is out of range for a 32-bit integer: ", value);
  return static_cast<int>(value);
}

template <>
double JsonObject::get<double>(const std::string& key) const {
  if (!has(key)) fail(source_, ": missing key '", key_name(key), "'");
  const Json& value = value_.at(key);
  if (!value.is_number()) fail(source_, ": key '", key_name(key), "' must be a number, got ", describe(value));
  return value.get<double>();
}

template <>
bool JsonObject::get<bool>(const std::string& key) const {
  if (!has(key)) fail(source_, ": missing key '", key_name(key), "'");
  const Json& value = value_.at(key);
  if (!value.is_boolean()) fail(source_, ": key '", key_name(key), "' must be true or false, got ", describe(value));
  return value.get<bool>();
}

template <>
std::string JsonObject::get<std::string>(const std::string& key) const {
  if (!has(key)) fail(source_, ": missing key '", key_name(key), "'");
  const Json& value = value_.at(key);
  if (!value.is_string()) fail(source_, ": key '", key_name(key), "' must be a string, got ", describe(value));
  return value.get<std::string>();
}

JsonObject JsonObject::object(const std::string& key) const {
  if (!has(key)) fail(source_, ": missing key '", key_name(key), "'");
  return JsonObject(value_.at(key), source_, key_name(key));
}

}  // namespace lt
