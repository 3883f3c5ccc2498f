// libFuzzer harness for the JSONL conversation reader (data/jsonl.h, data/chat_template.h): line
// splitting, each line's JSON, TRL's record forms and roles, and Ling's chat template rendering the
// conversations that load. Bad input must end in lt::Error; anything else escaping, a crash, a hang or a
// sanitizer report is a bug.
#include <cstddef>
#include <cstdint>

#include "data/chat_template.h"
#include "data/jsonl.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lt::ByteTokenizer tokenizer;
  const std::string& path = lt::fuzz::write_input(data, size);
  try {
    lt::for_each_jsonl_record(path, [&](const lt::Json& record, const std::string& where) {
      const lt::RenderedChat chat = lt::render_chat(lt::conversation_from_json(record, where), tokenizer, true);
      if (chat.ids.size() != chat.loss_mask.size()) __builtin_trap();
    });
  } catch (const lt::Error&) {
  }
  return 0;
}
