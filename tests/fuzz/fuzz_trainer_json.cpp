// libFuzzer harness for the trainer's JSON files: a recipe file (trainer/recipe.h) and a checkpoint's
// trainer_state.json (trainer/train_state.h) restored into a small Ling model, the same bytes fed to
// both. Bad input must end in lt::Error; anything else escaping, a crash, a hang or a sanitizer report
// is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "io/json.h"
#include "model/ling.h"
#include "tensor/error.h"
#include "tests/model/small_config.h"
#include "trainer/recipe.h"
#include "trainer/train_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Built once: restoring a state writes only the buffers, whose shapes the reader checks.
  static lt::LingForCausalLM model(lt::test::small_config(), 1);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  lt::Json json;
  try {
    json = lt::parse_json(text, "fuzz.json");
  } catch (const lt::Error&) {
    return 0;
  }
  try {
    const lt::Recipe recipe = lt::Recipe::from_json(json, "recipe.json");
    recipe.total_steps();
    for (const lt::StageSettings& stage : recipe.stages) stage.total_tokens();
  } catch (const lt::Error&) {
  }
  try {
    lt::TrainState state;
    lt::train_state_from_json(json, "trainer_state.json", state, model);
  } catch (const lt::Error&) {
  }
  return 0;
}
