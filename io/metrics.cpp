#include "io/metrics.h"

#include "tensor/error.h"

namespace lt {

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  if (path.empty()) return;
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
