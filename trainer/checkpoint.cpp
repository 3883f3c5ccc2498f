#include "trainer/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <unistd.h>

#include "dist/share_folder.h"
#include "io/atomic_file.h"
#include "io/format_text.h"
#include "io/input_file.h"
#include "io/safetensors.h"
#include "io/safetensors_folder.h"
#include "model/hf_names.h"
#include "tensor/kernels.h"

namespace lt {

namespace {
const char* const kStepsTakenKey = "adamw_steps_taken";
}  // namespace

namespace {
constexpr const char* kTokenizerFile = "/tokenizer.json";
}  // namespace

void save_checkpoint(const std::string& dir, const LingConfig& config, const CheckpointTensors& tensors,
                     const Json& trainer_state, const std::string& tokenizer_json,
                     const std::function<void(const std::string&)>& write_extra, DType weights_dtype,
                     const std::function<void(const std::string&)>& retire) {
  NamedTensors weights = hf_named(tensors.parameters);
  if (weights_dtype != DType::F32)
    for (auto& [name, tensor] : weights) tensor = tensor.to(Device::cpu()).to(weights_dtype);
  write_directory_atomic(dir, [&](const std::string& staging) {
    write_json_file(staging + "/config.json", config_to_json(config));
    save_safetensors(staging + "/model.safetensors", weights, {{"format", "pt"}});
    // The update count drives AdamW's bias corrections; it differs from the trainer's step when the
    // spike guard skipped updates.
    if (tensors.has_moments)
      save_safetensors(staging + "/optimizer.safetensors", tensors.moments,
                       {{"format", "pt"}, {kStepsTakenKey, std::to_string(tensors.steps_taken)}});
    write_json_file(staging + "/trainer_state.json", trainer_state);
    if (!tokenizer_json.empty()) write_file_atomic(staging + kTokenizerFile, tokenizer_json);
    if (write_extra) write_extra(staging);
  }, retire);
}

void save_checkpoint(const std::string& dir, LingForCausalLM& model, const AdamW* optimizer,
                     const Json& trainer_state, const std::string& tokenizer_json,
                     const std::function<void(const std::string&)>& write_extra, DType weights_dtype) {
  LT_CHECK(model.expert_slice().ranks == 1, "save_checkpoint: the model holds a slice of its experts");
  CheckpointTensors tensors;
  for (const Parameter& p : model.parameters()) tensors.parameters.emplace_back(p.name, p.value->value());
  if (optimizer != nullptr) {
    tensors.has_moments = true;
    tensors.moments = optimizer->state();
    tensors.steps_taken = optimizer->steps_taken();
  }
  save_checkpoint(dir, model.config(), tensors, trainer_state, tokenizer_json, write_extra, weights_dtype);
}

namespace {

constexpr const char* kHistoryFolder = "checkpoints";
constexpr const char* kKeptPrefix = "step-";
// A kept checkpoint on its way out is renamed to this first, so that a kill during its removal never
// leaves a partial folder under a kept name.
constexpr const char* kRemovingSuffix = ".removing";

void remove_whole(const std::string& dir) {
  const std::string removing = dir + kRemovingSuffix;
  std::filesystem::remove_all(removing);
  std::filesystem::rename(dir, removing);
  std::filesystem::remove_all(removing);
}

}  // namespace

SharedCheckpoint::SharedCheckpoint(Communicator& world, const std::string& dir) : folder_(dir) {
  if (world.size() == 1) return;
  const std::string copy = (std::filesystem::temp_directory_path() /
                            format_text("lingtrain-%d-checkpoint-rank-%d", static_cast<int>(::getpid()), world.rank()))
                               .string();
  folder_ = share_folder(world, 0, world.rank() == 0 ? checkpoint_folder(dir) : "", copy);
  if (world.rank() != 0) copy_ = copy;
}

SharedCheckpoint::~SharedCheckpoint() {
  std::error_code ignored;
  if (!copy_.empty()) std::filesystem::remove_all(copy_, ignored);
}

std::string checkpoint_history_dir(const std::string& out_dir) { return out_dir + "/" + kHistoryFolder; }

std::vector<KeptCheckpoint> checkpoint_history(const std::string& out_dir) {
  std::vector<KeptCheckpoint> kept;
  std::error_code error;
  for (std::filesystem::directory_iterator it(checkpoint_history_dir(out_dir), error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(kKeptPrefix)) continue;
    char* rest = nullptr;
    const long long step = std::strtoll(name.c_str() + std::strlen(kKeptPrefix), &rest, 10);
    if (*rest == '\0' && step >= 0) kept.push_back({step, it->path().string()});
  }
  std::sort(kept.begin(), kept.end(), [](const KeptCheckpoint& a, const KeptCheckpoint& b) { return a.step < b.step; });
  return kept;
}

int64_t checkpoint_step(const std::string& dir) {
  const std::string path = checkpoint_folder(dir) + "/trainer_state.json";
  return JsonObject(read_json_file(path), path).object("state").get<int64_t>("step");
}

void retire_checkpoint(const std::string& previous, const std::string& out_dir, int64_t new_step, int64_t keep,
                       int64_t keep_every) {
  namespace fs = std::filesystem;
  // Half-removed checkpoints of a killed run go first.
  std::error_code error;
  for (fs::directory_iterator it(checkpoint_history_dir(out_dir), error), end; !error && it != end; it.increment(error))
    if (it->path().filename().string().ends_with(kRemovingSuffix)) fs::remove_all(it->path());
  auto kept_for_ever = [&](int64_t step) { return keep_every > 0 && step % keep_every == 0; };
  int64_t step = -1;
  try {
    step = checkpoint_step(previous);
  } catch (const Error&) {
    // Not a complete checkpoint (never the case for a folder write_directory_atomic published): dropped.
  }
  if (step >= 0 && step < new_step && (keep > 1 || kept_for_ever(step))) {
    const std::string history = checkpoint_history_dir(out_dir);
    fs::create_directories(history);
    const std::string target = history + "/" + format_text("%s%08lld", kKeptPrefix, static_cast<long long>(step));
    if (fs::exists(target)) remove_whole(target);
    fs::rename(previous, target);
  } else {
    fs::remove_all(previous);
  }
  // The newest keep - 1 kept checkpoints before new_step stay, with those kept for ever.
  std::vector<KeptCheckpoint> kept = checkpoint_history(out_dir);
  int64_t recent = 0;
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
    if (it->step >= new_step) {
      remove_whole(it->dir);
      continue;
    }
    const bool stays = ++recent < keep || kept_for_ever(it->step);
    if (!stays) remove_whole(it->dir);
  }
}

std::string run_folder_of_checkpoint(const std::string& checkpoint) {
  std::filesystem::path path = std::filesystem::path(checkpoint).lexically_normal();
  if (!path.has_filename()) path = path.parent_path();
  std::filesystem::path folder = path.parent_path();
  if (folder.filename() == kHistoryFolder && path.filename().string().starts_with(kKeptPrefix))
    folder = folder.parent_path();
  return folder.empty() ? "." : folder.string();
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

namespace {

// optimizer.safetensors and its update count.
std::pair<SafetensorsFile, int64_t> load_optimizer_file(const std::string& dir, std::string& path) {
  path = checkpoint_folder(dir) + "/optimizer.safetensors";
  SafetensorsFile file = load_safetensors(path);
  const auto steps = file.metadata.find(kStepsTakenKey);
  LT_CHECK(steps != file.metadata.end(), path, ": no '", kStepsTakenKey, "' in the metadata");
  char* end = nullptr;
  const long long steps_taken = std::strtoll(steps->second.c_str(), &end, 10);
  LT_CHECK(!steps->second.empty() && *end == '\0' && steps_taken >= 0, path, ": '", kStepsTakenKey,
           "' must be a count, got '", steps->second, "'");
  return {std::move(file), steps_taken};
}

// A checkpoint's moments by name, each the model's part of it (its own experts' rows under expert parallelism).
std::map<std::string, Tensor> held_moments(const LingForCausalLM& model, const std::map<std::string, Tensor>& whole) {
  std::map<std::string, Tensor> held;
  for (const auto& [name, tensor] : whole) held[name] = held_part(model, AdamW::moment_parameter(name), tensor);
  return held;
}

}  // namespace

void load_checkpoint_optimizer(const std::string& dir, const LingForCausalLM& model, AdamW& optimizer) {
  std::string path;
  const auto [file, steps_taken] = load_optimizer_file(dir, path);
  const std::map<std::string, Tensor> held = held_moments(model, file.tensors);
  optimizer.load_state(NamedTensors(held.begin(), held.end()), steps_taken, path);
}

WeightsDifference compare_checkpoint_weights(const std::string& dir_a, const std::string& dir_b) {
  const SafetensorsFile a = load_safetensors_folder(checkpoint_folder(dir_a));
  const SafetensorsFile b = load_safetensors_folder(checkpoint_folder(dir_b));
  for (const auto& [name, tensor] : b.tensors)
    LT_CHECK(a.tensors.count(name), dir_a, ": no tensor '", name, "', which ", dir_b, " has");
  WeightsDifference d;
  for (const auto& [name, ta] : a.tensors) {
    const auto found = b.tensors.find(name);
    LT_CHECK(found != b.tensors.end(), dir_b, ": no tensor '", name, "', which ", dir_a, " has");
    LT_CHECK(ta.shape() == found->second.shape(), "tensor '", name, "' is ", shape_str(ta.shape()), " in ", dir_a,
             " and ", shape_str(found->second.shape()), " in ", dir_b);
    const std::vector<double> x = ta.to(DType::F64).to_vector<double>();
    const std::vector<double> y = found->second.to(DType::F64).to_vector<double>();
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff += (x[i] - y[i]) * (x[i] - y[i]);
      norm += y[i] * y[i];
      d.max_abs = std::max(d.max_abs, std::abs(x[i] - y[i]));
    }
    const double relative = diff == 0 ? 0 : std::sqrt(diff / norm);
    if (relative > d.max_relative) {
      d.max_relative = relative;
      d.worst = name;
    }
    ++d.tensors;
  }
  return d;
}

std::string checkpoint_rank_path(const std::string& folder, int rank) {
  char name[48];
  std::snprintf(name, sizeof name, "/edit/rank-%05d.safetensors", rank);
  return folder + name;
}

WholeMoments load_checkpoint_moments(const std::string& dir, const LingForCausalLM& model, const FlatParameters& params,
                                     const CheckpointLayout& from) {
  WholeMoments whole{Tensor::zeros({params.layout_numel()}, DType::F32),
                     Tensor::zeros({params.layout_numel()}, DType::F32), 0};
  if (!from.per_rank_shards) {
    std::string path;
    const auto [file, steps_taken] = load_optimizer_file(dir, path);
    copy_named_moments(params, held_moments(model, file.tensors), whole.exp_avg, whole.exp_avg_sq, path);
    whole.steps_taken = steps_taken;
    return whole;
  }
  const std::string folder = checkpoint_folder(dir);
  const int G = from.expert_parallel, S = from.shard_group;
  const int64_t E = model.config().num_experts;
  LT_CHECK(S >= 1 && G >= 1 && (G == 1 || S == 1) && from.world_size % std::max(S, G) == 0 && (G == 1 || E % G == 0),
           folder, ": ", from.world_size, " ranks do not form replicas of ", std::max(S, G));
  // A checkpoint rank's flat layout: this model's parameters in order, the stacked experts' first dimension
  // the E / G experts a rank of the checkpoint held; a replica's ranks hold its shards end to end (S) or
  // each its own experts (G).
  struct Slot {
    std::string name;
    Shape shape;  // as the checkpoint's rank held it
    int64_t offset = 0;
    bool experts = false;
  };
  std::vector<Slot> slots;
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  for (const FlatParameters::ParameterRange& p : params.parameters()) {
    Slot slot{p.parameter.name, p.parameter.value->value().shape(), 0, is_stacked_experts(p.parameter.name)};
    if (slot.experts) slot.shape[0] = E / G;
    names.push_back(slot.name);
    sizes.push_back(shape_numel(slot.shape));
    slots.push_back(slot);
  }
  // Under parameter sharding a replica's R ranks held their part of every unit of the replica's layout (under
  // expert parallelism the experts' units whole, each rank its own), end to end.
  const int R = std::max(S, G);
  const LayerShards held_parts = !from.shard_params ? LayerShards{}
                                 : G > 1            ? LayerShards{0, R, is_stacked_experts, 0, 1}
                                                    : LayerShards{0, R};
  const FlatParameters::Layout layout = FlatParameters::layout_of(names, sizes, 1, held_parts);
  const int64_t rank_numel = from.shard_params ? layout.held_numel : (layout.numel + S - 1) / S;
  for (size_t i = 0; i < slots.size(); ++i) slots[i].offset = layout.parameters[i].begin;
  // The whole model's moments by name, summed over the replicas in rank order, then divided: the same
  // bytes on every rank that reads them.
  std::map<std::string, Tensor> named;
  for (const Slot& slot : slots)
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
      Shape shape = slot.shape;
      if (slot.experts) shape[0] = E;
      named[slot.name + moment] = Tensor::zeros(shape, DType::F32);
    }
  const int replicas = from.world_size / R;
  for (int replica = 0; replica < replicas; ++replica) {
    std::map<std::string, std::vector<Tensor>> held;  // per moment: the replica's ranks' flat buffers
    for (int rank = replica * R; rank < (replica + 1) * R; ++rank) {
      const std::string path = checkpoint_rank_path(folder, rank);
      LT_CHECK(std::filesystem::exists(path), path, ": missing (the checkpoint was written by ", from.world_size,
               " ranks)");
      const SafetensorsFile file = load_safetensors(path);
      const auto text = file.metadata.find("state");
      LT_CHECK(text != file.metadata.end(), path, ": no 'state' in the metadata");
      whole.steps_taken = std::max<int64_t>(
          whole.steps_taken, JsonObject(parse_json(text->second, path), path).get<int64_t>("adamw_steps"));
      for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
        held[moment].push_back(file.get(moment).to(DType::F32));
        LT_CHECK(held[moment].back().numel() >= rank_numel, path, ": '", moment, "' holds ",
                 held[moment].back().numel(), " elements, a rank of this model's layout ", rank_numel);
      }
    }
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const std::vector<Tensor>& ranks = held[moment];
      // The replica's layout whole with rank `own`'s experts: a rank's own buffer, its shards end to end, or
      // its ranks' parts of every unit.
      auto whole_layout = [&](int own) {
        if (!from.shard_params && S == 1) return ranks[static_cast<size_t>(own)];
        Tensor flat = Tensor::zeros({from.shard_params ? layout.numel : ranks[0].numel() * S}, DType::F32);
        for (int r = 0; r < S && !from.shard_params; ++r)
          flat.narrow(r * ranks[0].numel(), ranks[0].numel()).copy_from(ranks[static_cast<size_t>(r)]);
        for (const FlatParameters::Unit& unit : layout.units)
          for (int r = 0; r < unit.parts; ++r) {
            const Tensor& from_rank = ranks[static_cast<size_t>(unit.parts == 1 ? own : r)];
            flat.narrow(unit.range.begin + r * unit.held.size(), unit.held.size())
                .copy_from(from_rank.narrow(unit.held.begin, unit.held.size()));
          }
        return flat;
      };
      for (int own = 0; own < G; ++own) {
        const Tensor flat = whole_layout(own);
        for (const Slot& slot : slots) {
          Tensor& target = named[slot.name + "." + moment];
          Tensor part = slot.experts ? target.narrow(own * (E / G), E / G) : target;
          kernels::axpy(1.0, flat.narrow(slot.offset, shape_numel(slot.shape)).reshape(slot.shape), part);
        }
      }
    }
  }
  // Every replica added each expert once, and each of its G ranks added the replicated parameters.
  for (const Slot& slot : slots)
    for (const char* moment : {".exp_avg", ".exp_avg_sq"}) {
      Tensor& t = named[slot.name + moment];
      kernels::scale(t, 1.0 / (slot.experts ? replicas : replicas * G), t);
    }
  copy_named_moments(params, held_moments(model, named), whole.exp_avg, whole.exp_avg_sq, folder);
  return whole;
}

}  // namespace lt
