// libFuzzer harness for the multiple-choice item reader (data/multiple_choice.h): line splitting, each
// line's JSON, the plain and HellaSwag forms (the harness's text clean-up included), and the token
// sequences of the items that load, with and without a one-shot prompt and with a limit that truncates
// them. Bad input must end in lt::Error; anything else escaping, a crash, a hang or a sanitizer report is
// a bug.
#include <cstddef>
#include <cstdint>

#include "data/multiple_choice.h"
#include "tensor/error.h"
#include "tests/fuzz/fuzz_input_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lt::ByteTokenizer tokenizer;
  const std::string& path = lt::fuzz::write_input(data, size);
  try {
    const std::vector<lt::MultipleChoiceItem> items = lt::read_multiple_choice_file(path);
    for (size_t i = 0; i < items.size(); ++i) {
      const lt::MultipleChoiceItem& item = items[i];
      std::string context = item.context;
      if (items.size() > 1) context = lt::few_shot_context(item, {&items[(i + 1) % items.size()]});
      for (int64_t max_tokens : {int64_t{4096}, int64_t{24}}) {
        const lt::MultipleChoiceSequences sequences =
            lt::multiple_choice_sequences(item, context, tokenizer, max_tokens);
        if (sequences.choices.size() != item.choices.size()) __builtin_trap();
      }
    }
  } catch (const lt::Error&) {
  }
  return 0;
}
