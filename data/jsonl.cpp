#include "data/jsonl.h"

#include <string_view>

#include "io/atomic_file.h"
#include "io/input_file.h"
#include "tensor/error.h"

namespace lt {

void for_each_jsonl_record(const std::string& path,
                           const std::function<void(const Json& record, const std::string& where)>& on_record) {
  const std::string text = read_file(path);
  size_t begin = 0;
  for (int64_t line = 1; begin < text.size(); ++line) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view content(text.data() + begin, end - begin);
    if (content.ends_with('\r')) content.remove_suffix(1);
    begin = end + 1;
    if (content.find_first_not_of(" \t") == std::string_view::npos) continue;
    const std::string where = path + ":" + std::to_string(line);
    const Json record = parse_json(content, where);
    LT_CHECK(record.is_object(), where, ": a record must be a JSON object, got ", record.type_name());
    on_record(record, where);
  }
}

void write_jsonl_file(const std::string& path, const std::vector<Json>& records) {
  write_file_atomic(path, [&](FileSink& sink) {
    for (const Json& record : records) {
      sink.write(record.dump());
      sink.write("\n");
    }
  });
}

}  // namespace lt
