#include "trainer/checkpoint.h"

#include <filesystem>

#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/safetensors_folder.h"
#include "model/hf_names.h"

namespace lt {

void save_checkpoint(const std::string& dir, LingForCausalLM& model, const AdamW* optimizer,
                     const Json& trainer_state) {
  write_directory_atomic(dir, [&](const std::string& staging) {
    write_json_file(staging + "/config.json", config_to_json(model.config()));
    save_safetensors(staging + "/model.safetensors", hf_state_dict(model), {{"format", "pt"}});
    if (optimizer != nullptr) save_safetensors(staging + "/optimizer.safetensors", optimizer->state());
    write_json_file(staging + "/trainer_state.json", trainer_state);
  });
}

std::string checkpoint_folder(const std::string& dir) {
  const std::optional<std::string> found = find_complete_directory(dir);
  LT_CHECK(found.has_value(), dir, ": no checkpoint here");
  LT_CHECK(std::filesystem::exists(*found + "/config.json"), *found, ": not a checkpoint (no config.json)");
  return *found;
}

LingConfig load_checkpoint_config(const std::string& dir) { return load_config(checkpoint_folder(dir) + "/config.json"); }

void load_checkpoint_weights(const std::string& dir, LingForCausalLM& model) {
  load_hf_state_dict(model, load_safetensors_folder(checkpoint_folder(dir)));
}

Json load_trainer_state(const std::string& dir) { return read_json_file(checkpoint_folder(dir) + "/trainer_state.json"); }

void load_checkpoint_optimizer(const std::string& dir, AdamW& optimizer, int64_t steps_taken) {
  const std::string path = checkpoint_folder(dir) + "/optimizer.safetensors";
  const SafetensorsFile file = load_safetensors(path);
  optimizer.load_state(NamedTensors(file.tensors.begin(), file.tensors.end()), steps_taken, path);
}

}  // namespace lt
