// The texts of model/presets/*.json, compiled into the library so that `--model tiny` works from any
// working directory with nothing installed beside the binary. cmake/embed_presets.cmake writes the
// definition at build time; model/config.cpp parses a text like any config.json.
#pragma once
#include <span>
#include <string_view>

namespace lt {

struct PresetText {
  std::string_view name;  // the file name without ".json"
  std::string_view json;
};

std::span<const PresetText> preset_texts();  // sorted by name

}  // namespace lt
