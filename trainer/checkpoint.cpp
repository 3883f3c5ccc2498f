#include "trainer/checkpoint.h"

#include <cstdlib>
#include <filesystem>

#include "io/atomic_file.h"
#include "io/input_file.h"
#include "io/safetensors.h"
#include "io/safetensors_folder.h"
#include "model/hf_names.h"

namespace lt {

namespace {
const char* const kStepsTakenKey = "adamw_steps_taken";
}  // namespace

namespace {
constexpr const char* kTokenizerFile = "/tokenizer.json";
}  // namespace

void save_checkpoint(const std::string& dir, LingForCausalLM& model, const AdamW* optimizer,
                     const Json& trainer_state, const std::string& tokenizer_json,
                     const std::function<void(const std::string&)>& write_extra, DType weights_dtype) {
  NamedTensors weights = hf_state_dict(model);
  if (weights_dtype != DType::F32)
    for (auto& [name, tensor] : weights) tensor = tensor.to(Device::cpu()).to(weights_dtype);
  write_directory_atomic(dir, [&](const std::string& staging) {
    write_json_file(staging + "/config.json", config_to_json(model.config()));
    save_safetensors(staging + "/model.safetensors", weights, {{"format", "pt"}});
    // The update count drives AdamW's bias corrections; it differs from the trainer's step when the
    // spike guard skipped updates.
    if (optimizer != nullptr)
      save_safetensors(staging + "/optimizer.safetensors", optimizer->state(),
                       {{"format", "pt"}, {kStepsTakenKey, std::to_string(optimizer->steps_taken())}});
    write_json_file(staging + "/trainer_state.json", trainer_state);
    if (!tokenizer_json.empty()) write_file_atomic(staging + kTokenizerFile, tokenizer_json);
    if (write_extra) write_extra(staging);
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

std::string load_checkpoint_tokenizer_json(const std::string& dir) {
  const std::string path = checkpoint_folder(dir) + kTokenizerFile;
  return std::filesystem::exists(path) ? read_file(path) : std::string();
}

std::unique_ptr<Tokenizer> resolve_tokenizer(const std::string& flag_path, const std::string& checkpoint,
                                             int64_t model_vocab_size) {
  std::string source = flag_path;
  if (source.empty() && !checkpoint.empty() && std::filesystem::exists(checkpoint_folder(checkpoint) + kTokenizerFile))
    source = checkpoint_folder(checkpoint) + kTokenizerFile;
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(source);
  LT_CHECK(tokenizer->vocab_size() <= model_vocab_size, source.empty() ? "the byte tokenizer" : source, ": ",
           tokenizer->vocab_size(), " tokens do not fit the model's vocab_size ", model_vocab_size,
           " (a config.json with a larger vocab_size makes room)");
  return tokenizer;
}

void load_checkpoint_optimizer(const std::string& dir, AdamW& optimizer) {
  const std::string path = checkpoint_folder(dir) + "/optimizer.safetensors";
  const SafetensorsFile file = load_safetensors(path);
  const auto steps = file.metadata.find(kStepsTakenKey);
  LT_CHECK(steps != file.metadata.end(), path, ": no '", kStepsTakenKey, "' in the metadata");
  char* end = nullptr;
  const long long steps_taken = std::strtoll(steps->second.c_str(), &end, 10);
  LT_CHECK(!steps->second.empty() && *end == '\0' && steps_taken >= 0, path, ": '", kStepsTakenKey,
           "' must be a count, got '", steps->second, "'");
  optimizer.load_state(NamedTensors(file.tensors.begin(), file.tensors.end()), steps_taken, path);
}

}  // namespace lt
