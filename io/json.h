// JSON files (config.json, metrics, manifests) over nlohmann::json, with the errors the CLI prints:
// a parse error names the file, the line, the column and the byte offset; a lookup names the file, the
// key and the type it got ("config.json: key 'hidden_size' must be an integer, got string").
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lt {

using Json = nlohmann::json;

// `source` is the name errors carry (a path, or "<flag --config>").
Json parse_json(std::string_view text, const std::string& source);
Json read_json_file(const std::string& path);
// Pretty-printed with `indent` spaces and a final newline, written atomically.
void write_json_file(const std::string& path, const Json& value, int indent = 2);

// A JSON object together with where it came from, so that every lookup error can say which file and
// which key. Nested objects keep a dotted key path ("config.json: key 'rope_scaling.factor' ...").
// A key holding null counts as absent, as Hugging Face configs write "rope_scaling": null for "unset".
class JsonObject {
 public:
  // Fails unless `value` is an object. The JsonObject refers to `value`, which must outlive it.
  JsonObject(const Json& value, std::string source, std::string key_path = "");

  bool has(const std::string& key) const;
  // Supported T: int64_t, int (range-checked), double (accepts integers), bool, std::string.
  template <class T>
  T get(const std::string& key) const;  // fails when the key is absent
  template <class T>
  T get(const std::string& key, const T& fallback) const {  // fallback when absent
    return has(key) ? get<T>(key) : fallback;
  }
  JsonObject object(const std::string& key) const;       // a nested object; fails when absent
  const Json& json() const { return value_; }
  const std::string& source() const { return source_; }

 private:
  std::string key_name(const std::string& key) const;  // with the path of enclosing objects
  const Json& value_;
  std::string source_;
  std::string key_path_;
};

template <> int64_t JsonObject::get<int64_t>(const std::string& key) const;
template <> int JsonObject::get<int>(const std::string& key) const;
template <> double JsonObject::get<double>(const std::string& key) const;
template <> bool JsonObject::get<bool>(const std::string& key) const;
template <> std::string JsonObject::get<std::string>(const std::string& key) const;

}  // namespace lt
