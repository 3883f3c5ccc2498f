// libFuzzer harness for config.json (model/config.h): the JSON parse, the validation in
// config_from_json, and the parameter count `lingtrain inspect` prints from the shapes alone. Bad input
// must end in lt::Error; anything else escaping, a crash, a hang or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/json.h"
#include "model/config.h"
#include "tensor/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const lt::LingConfig config = lt::config_from_json(lt::parse_json(text, "config.json"), "config.json");
    lt::count_parameters(config);
  } catch (const lt::Error&) {
  }
  return 0;
}
