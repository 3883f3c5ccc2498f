#include "io/metrics.h"

#include <filesystem>
#include <fstream>

#include "io/atomic_file.h"
#include "tensor/error.h"

namespace lt {

namespace {
// The lines of the log at `path` that hold a whole record of a step up to `step`, in order. A record
// with "heldout": "end" holds the figures at the end of the run that wrote it: the resumed run goes on
// past that end and writes its own.
std::string records_through(const std::string& path, int64_t step) {
  std::ifstream in(path);
  std::string kept, line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: a torn last line
    Json record;
    try {
      record = Json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;
    }
    if (record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
        record["step"].get<int64_t>() <= step && record.value("heldout", Json()) != "end")
      kept += line + "\n";
  }
  return kept;
}
}  // namespace

MetricsLog::MetricsLog(const std::string& path, int64_t keep_through_step) : path_(path) {
  if (path.empty()) return;
  if (keep_through_step >= 0 && std::filesystem::exists(path))
    write_file_atomic(path, records_through(path, keep_through_step));
  file_ = std::fopen(path.c_str(), "a");
  LT_CHECK(file_ != nullptr, path, ": cannot open the metrics log for writing");
}

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsLog::write(const Json& record) {
  if (file_ == nullptr) return;
  const std::string line = record.dump() + "\n";
  LT_CHECK(std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0, path_,
           ": cannot write the metrics log (disk full?)");
}

}  // namespace lt
