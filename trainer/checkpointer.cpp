#include "trainer/checkpointer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "model/hf_names.h"
#include "tensor/kernels.h"
#include "trainer/checkpoint.h"

namespace lt {

namespace {

// The whole model's parameters and, with moments, its AdamW moments by name. Under parameter sharding
// (shards set) every rank's part of each unit is first gathered (ParameterShards::whole): the model each rank
// of the first expert-parallel group holds, whole on it (the replicated parameters on rank 0). Under expert
// parallelism (group set) each stacked-experts tensor is then gathered from the group's ranks to its rank 0
// in rank order (rank g holds experts [g L, (g + 1) L), so the gather lays them out [E, ...]) in host memory.
// Collective over the world with shards, over the group without; only rank 0's result is whole. Called on
// the ranks of rank 0's expert-parallel group (every rank under parameter sharding).
CheckpointTensors whole_model(Trainer& trainer, Communicator* group, bool moments, ParameterShards* shards) {
  const FlatParameters& params = trainer.parameters();
  NamedTensors held_values, held_moments;
  if (shards == nullptr) {
    for (const FlatParameters::ParameterRange& p : params.parameters())
      held_values.emplace_back(p.parameter.name, p.parameter.value->value());
    if (moments) held_moments = trainer.optimizer().state();
  } else {
    const Tensor values = shards->whole(params.values());
    std::vector<Tensor> flat_moments;
    if (moments)
      for (const auto& [name, held] : trainer.optimizer().shard_state()) flat_moments.push_back(shards->whole(held));
    if (!values.defined()) return {};  // a rank outside rank 0's expert-parallel group
    for (size_t i = 0; i < params.parameters().size(); ++i) {
      const std::string& name = params.parameters()[i].parameter.name;
      held_values.emplace_back(name, params.view(values, i));
      if (!moments) continue;
      held_moments.emplace_back(name + ".exp_avg", params.view(flat_moments[0], i));
      held_moments.emplace_back(name + ".exp_avg_sq", params.view(flat_moments[1], i));
    }
  }
  const bool lead = group == nullptr || group->rank() == 0;
  auto whole = [&](const std::string& parameter, const Tensor& held) {
    if (group == nullptr || !is_stacked_experts(parameter)) return held;
    const Tensor flat = held.to(Device::cpu()).reshape({held.numel()});
    Shape shape = held.shape();
    shape[0] *= group->size();
    Tensor all = lead ? Tensor::empty({flat.numel() * group->size()}, flat.dtype()) : Tensor();
    group->gather(flat, all, 0);
    return lead ? all.reshape(shape) : Tensor();
  };
  CheckpointTensors tensors;
  for (const auto& [name, value] : held_values) tensors.parameters.emplace_back(name, whole(name, value));
  tensors.has_moments = moments;
  if (!moments) return tensors;
  for (const auto& [name, moment] : held_moments)
    tensors.moments.emplace_back(name, whole(AdamW::moment_parameter(name), moment));
  tensors.steps_taken = trainer.optimizer().steps_taken();
  return tensors;
}

// A copy in host memory of what may still change (the live weights and moments; a GPU's are copied off
// it), for a write that happens while training goes on.
void snapshot(NamedTensors& tensors) {
  for (auto& [name, t] : tensors)
    if (t.defined()) t = t.device().is_cpu() ? t.clone() : t.to(Device::cpu());
}


}  // namespace

Checkpointer::Checkpointer(RunSetup& setup, Trainer& trainer, SpikeGuard& guard, RankState* rank_state,
                           ParameterShards* shards)
    : setup_(setup),
      trainer_(trainer),
      guard_(guard),
      rank_state_(rank_state),
      shards_(shards),
      dir_(setup.checkpoint_dir()) {}

void Checkpointer::save(int64_t seq_len) {
  writer_.wait();  // one copy of the state in flight at a time
  reloads_since_save_ = 0;
  LingForCausalLM& model = setup_.model();
  const TrainState& state = trainer_.state();
  // A non-finite weight would make every later resume diverge at once; the guard keeps them out, and
  // this keeps them out of the checkpoint whatever happened.
  const Tensor& values = trainer_.parameters().values();
  Tensor sum_squares = Tensor::empty({1}, values.dtype(), values.device());
  kernels::sum_squares(values, sum_squares);
  // Under parameter sharding each rank holds a part: every rank decides on the whole.
  if (shards_) sum_squares = Tensor::full({1}, shards_->grad_sum_squares(sum_squares.item()), DType::F64);
  LT_CHECK(std::isfinite(sum_squares.item()), "the weights are not finite at step ", state.step,
           ": not writing a checkpoint over ", dir_);
  const Json trainer_state = {{"state", train_state_to_json(state, model)},
                              {"recipe", setup_.recipe().to_json()},
                              {"seq_len", seq_len},
                              {"dist", setup_.dist_json()},
                              {"spike_guard", guard_.to_json()}};
  const bool lead = setup_.lead();
  // The model (with the optimiser where every rank holds the same): under expert parallelism the ranks of
  // rank 0's group hold every expert between them.
  Communicator* group = setup_.expert_group();
  CheckpointTensors whole;
  if (shards_ != nullptr || group == nullptr || setup_.evaluates())
    whole = whole_model(trainer_, group, rank_state_ == nullptr, shards_);
  // Every rank's own state is gathered to rank 0 in host memory, where the checkpoint is written.
  std::vector<std::string> own_names, own_texts;
  std::vector<Tensor> own_all;  // per tensor: every rank's, end to end
  if (rank_state_ != nullptr) {
    Communicator& world = setup_.world();
    NamedTensors own = rank_state_->own_tensors();
    Json own_json = rank_state_->own_json();
    own_json["state"] = train_state_to_json(state, model);
    own_texts = gather_text(world, own_json.dump(), 0);
    for (auto& [name, t] : own) {
      const Tensor host = t.to(Device::cpu());
      own_names.push_back(name);
      own_all.push_back(lead ? Tensor::empty({host.numel() * world.size()}, host.dtype()) : Tensor());
      world.gather(host, own_all.back(), 0);
    }
  }
  if (!lead) return;
  const RunOptions& options = setup_.options();
  const bool async = options.async_checkpoints;
  if (async) {
    snapshot(whole.parameters);
    snapshot(whole.moments);
  }
  auto write = [this, whole = std::move(whole), trainer_state, own_names = std::move(own_names),
                own_texts = std::move(own_texts), own_all = std::move(own_all), step = state.step,
                config = model.config(), tokenizer_json = setup_.tokenizer().json_text,
                weights_dtype = options.save_dtype,
                out_dir = options.out_dir, keep = options.keep_checkpoints, keep_every = options.keep_every] {
    auto write_ranks = [&](const std::string& staging) {
      std::filesystem::create_directories(staging + "/edit");
      const int ranks = static_cast<int>(own_texts.size());
      for (int r = 0; r < ranks; ++r) {
        NamedTensors rank_tensors;
        for (size_t i = 0; i < own_names.size(); ++i) {
          const int64_t n = own_all[i].numel() / ranks;
          rank_tensors.emplace_back(own_names[i], own_all[i].narrow(r * n, n));
        }
        save_safetensors(checkpoint_rank_path(staging, r), rank_tensors,
                         {{"state", own_texts[static_cast<size_t>(r)]}});
      }
    };
    save_checkpoint(dir_, config, whole, trainer_state, tokenizer_json,
                    own_texts.empty() ? std::function<void(const std::string&)>() : write_ranks, weights_dtype,
                    [&](const std::string& previous) { retire_checkpoint(previous, out_dir, step, keep, keep_every); });
  };
  if (async) writer_.start(std::move(write));
  else write();
}

std::string Checkpointer::reload_dir() {
  writer_.wait();
  const std::vector<KeptCheckpoint> kept = checkpoint_history(setup_.options().out_dir);
  const int64_t back = std::min<int64_t>(reloads_since_save_++, static_cast<int64_t>(kept.size()));
  return back <= 0 ? dir_ : kept[kept.size() - static_cast<size_t>(back)].dir;
}

void Checkpointer::restore(const std::string& dir, bool reloading) {
  writer_.wait();
  LingForCausalLM& model = setup_.model();
  TrainState& state = trainer_.state();
  const std::string folder = checkpoint_folder(dir);
  const Json saved = load_trainer_state(dir);
  if (shards_) shards_->with_whole_model([&] { load_checkpoint_weights(dir, model); });
  else load_checkpoint_weights(dir, model);
  trainer_.values_changed();
  train_state_from_json(saved.at("state"), folder + "/trainer_state.json", state, model);
  // A reload keeps the guard as it is: its count of reloads and its cuts must outlive the reload.
  if (!reloading && saved.contains("spike_guard")) guard_.load(saved.at("spike_guard"), folder + "/trainer_state.json");
  if (setup_.relayout() || (shards_ != nullptr && rank_state_ == nullptr)) {
    // Another layout, or a rank's part of a model every rank shares: the moments, whole, then this rank's part;
    // EDiT's own state starts afresh (the anchor is taken when its local steps begin, from the weights
    // every replica loaded).
    const RunSetup::Layout& from = setup_.checkpoint_layout();
    const FlatParameters& params = trainer_.parameters();
    WholeMoments whole = load_checkpoint_moments(dir, model, params,
                                                 {from.mode != DistMode::DataParallel, from.world_size,
                                                  from.shard_group, from.expert_parallel, from.shard_params});
    Tensor exp_avg = Tensor::empty({params.numel()}, DType::F32);
    Tensor exp_avg_sq = Tensor::empty({params.numel()}, DType::F32);
    params.hold(whole.exp_avg, exp_avg);
    params.hold(whole.exp_avg_sq, exp_avg_sq);
    AdamW& adamw = trainer_.optimizer();
    const FlatParameters::Range owned = adamw.owned();
    adamw.load_shard_state({{"exp_avg", exp_avg.narrow(owned.begin, owned.size())},
                            {"exp_avg_sq", exp_avg_sq.narrow(owned.begin, owned.size())}},
                           whole.steps_taken, folder);
    return;
  }
  if (rank_state_ == nullptr) {
    load_checkpoint_optimizer(dir, model, trainer_.optimizer());
    return;
  }
  const std::string path = checkpoint_rank_path(folder, setup_.world().rank());
  LT_CHECK(std::filesystem::exists(path), path, ": missing");
  const SafetensorsFile file = load_safetensors(path);
  const auto text = file.metadata.find("state");
  LT_CHECK(text != file.metadata.end(), path, ": no 'state' in the metadata");
  const Json own = parse_json(text->second, path);
  const JsonObject fields(own, path);
  train_state_from_json(fields.object("state").json(), path, state, model);
  rank_state_->load_own(file, fields);
}

}  // namespace lt
