// libFuzzer harness for the safetensors reader (io/safetensors.h): the header parser, the whole-file
// loader and the single-tensor loader. Bad input must end in lt::Error; anything else escaping, a
// crash, a hang or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lt::fuzz::write_input(data, size);
  try {
    const lt::SafetensorsHeader header = lt::read_safetensors_header(path);
    const lt::SafetensorsFile file = lt::load_safetensors(path);
    // The single-tensor path checks shape and dtype before reading; ask for the first entry as it is.
    if (!header.entries.empty()) {
      const lt::SafetensorsEntry& first = header.entries.front();
      lt::load_safetensors_tensor(path, first.name, first.shape, first.dtype);
    }
  } catch (const lt::Error&) {
  }
  return 0;
}
