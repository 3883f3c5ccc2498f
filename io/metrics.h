// The metrics log: one JSON object per line (JSONL), flushed after every record so a run that dies
// loses at most the line being written, and `tail -f` shows training as it happens.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "io/json.h"

namespace lt {

class MetricsLog {
 public:
  // Opens `path` for appending (a resumed run continues the same file); empty path = no log. With
  // keep_through_step >= 0 (a resume), the records of later steps (the ones the run is about to redo)
  // and a torn last line (a run killed mid-write, a full disk) are dropped first, atomically, and so is
  // the record of the held-out figures at the end of the run resumed ("heldout": "end").
  explicit MetricsLog(const std::string& path, int64_t keep_through_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const Json& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace lt
