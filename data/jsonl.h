// JSON Lines files (SFT conversations, DPO pairs): one JSON object per line, blank lines skipped.
// Every error names the file and the line ("train.jsonl:12: ..."), so a bad record in a million-line
// file is found at once.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/json.h"

namespace lt {

// Calls on_record(record, where) for each non-blank line in order; `where` is "path:line", for the
// errors on_record raises about the record's contents. A line that is not a JSON object fails with its
// file and line; so does a missing or unreadable file.
void for_each_jsonl_record(const std::string& path,
                           const std::function<void(const Json& record, const std::string& where)>& on_record);

// One record per line, written atomically.
void write_jsonl_file(const std::string& path, const std::vector<Json>& records);

}  // namespace lt
