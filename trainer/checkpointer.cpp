#include "trainer/checkpointer.h"

#include <cmath>
#include <filesystem>

#include "model/hf_names.h"
#include "tensor/kernels.h"
#include "trainer/checkpoint.h"

namespace lt {

namespace {

// The whole model's parameters and, with moments, its AdamW moments by name. Under expert parallelism
// (group set) each stacked-experts tensor is gathered from the group's ranks to its rank 0 in rank order
// (rank g holds experts [g L, (g + 1) L), so the gather lays them out [E, ...]) in host memory: collective
// over the group, and only its rank 0's result is whole.
CheckpointTensors whole_model(Trainer& trainer, Communicator* group, bool moments) {
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
  for (const FlatParameters::ParameterRange& p : trainer.parameters().parameters())
    tensors.parameters.emplace_back(p.parameter.name, whole(p.parameter.name, p.parameter.value->value()));
  tensors.has_moments = moments;
  if (!moments) return tensors;
  for (const auto& [name, moment] : trainer.optimizer().state())
    tensors.moments.emplace_back(name, whole(AdamW::moment_parameter(name), moment));
  tensors.steps_taken = trainer.optimizer().steps_taken();
  return tensors;
}

}  // namespace

Checkpointer::Checkpointer(RunSetup& setup, Trainer& trainer, SpikeGuard& guard, RankState* rank_state)
    : setup_(setup), trainer_(trainer), guard_(guard), rank_state_(rank_state), dir_(setup.checkpoint_dir()) {}

void Checkpointer::save(int64_t seq_len) {
  LingForCausalLM& model = setup_.model();
  const TrainState& state = trainer_.state();
  // A non-finite weight would make every later resume diverge at once; the guard keeps them out, and
  // this keeps them out of the checkpoint whatever happened.
  const Tensor& values = trainer_.parameters().values();
  Tensor sum_squares = Tensor::empty({1}, values.dtype(), values.device());
  kernels::sum_squares(values, sum_squares);
  LT_CHECK(std::isfinite(sum_squares.item()), "the weights are not finite at step ", state.step,
           ": not writing a checkpoint over ", dir_);
  const Json trainer_state = {{"state", train_state_to_json(state, model)},
                              {"recipe", setup_.recipe().to_json()},
                              {"seq_len", seq_len},
                              {"dist", setup_.dist_json()},
                              {"spike_guard", guard_.to_json()}};
  const bool lead = setup_.lead();
  const std::string& tokenizer_json = setup_.tokenizer().json_text;
  const DType weights_dtype = setup_.options().save_dtype;
  // The model (with the optimiser where every rank holds the same): under expert parallelism the ranks of
  // rank 0's group hold every expert between them.
  Communicator* group = setup_.expert_group();
  CheckpointTensors whole;
  if (group == nullptr || setup_.evaluates()) whole = whole_model(trainer_, group, rank_state_ == nullptr);
  if (rank_state_ == nullptr) {
    if (lead) save_checkpoint(dir_, model.config(), whole, trainer_state, tokenizer_json, {}, weights_dtype);
    return;
  }
  // Every rank's own state is gathered to rank 0 in host memory, where the checkpoint is written.
  Communicator& world = setup_.world();
  NamedTensors own = rank_state_->own_tensors();
  for (auto& [name, t] : own) t = t.to(Device::cpu());
  Json own_json = rank_state_->own_json();
  own_json["state"] = train_state_to_json(state, model);
  const std::vector<std::string> texts = gather_text(world, own_json.dump(), 0);
  std::vector<Tensor> all;
  for (const auto& [name, t] : own) {
    all.push_back(lead ? Tensor::empty({t.numel() * world.size()}, t.dtype()) : Tensor());
    world.gather(t, all.back(), 0);
  }
  if (!lead) return;
  save_checkpoint(dir_, model.config(), whole, trainer_state, tokenizer_json, [&](const std::string& staging) {
    std::filesystem::create_directories(staging + "/edit");
    for (int r = 0; r < world.size(); ++r) {
      NamedTensors rank_tensors;
      for (size_t i = 0; i < own.size(); ++i)
        rank_tensors.emplace_back(own[i].first, all[i].narrow(r * own[i].second.numel(), own[i].second.numel()));
      save_safetensors(checkpoint_rank_path(staging, r), rank_tensors, {{"state", texts[static_cast<size_t>(r)]}});
    }
  }, weights_dtype);
}

void Checkpointer::restore(const std::string& dir, bool reloading) {
  LingForCausalLM& model = setup_.model();
  TrainState& state = trainer_.state();
  const std::string folder = checkpoint_folder(dir);
  const Json saved = load_trainer_state(dir);
  load_checkpoint_weights(dir, model);
  train_state_from_json(saved.at("state"), folder + "/trainer_state.json", state, model);
  // A reload keeps the guard as it is: its count of reloads and its cuts must outlive the reload.
  if (!reloading && saved.contains("spike_guard")) guard_.load(saved.at("spike_guard"), folder + "/trainer_state.json");
  if (setup_.relayout()) {
    // Another layout: the moments, whole, then this rank's part of them; EDiT's own state starts afresh
    // (the anchor is taken when its local steps begin, from the weights every replica loaded).
    const RunSetup::Layout& from = setup_.checkpoint_layout();
    const WholeMoments whole =
        load_checkpoint_moments(dir, model, trainer_.parameters(),
                                {from.mode != DistMode::DataParallel, from.world_size, from.shard_group,
                                 from.expert_parallel});
    AdamW& adamw = trainer_.optimizer();
    const FlatParameters::Range owned = adamw.owned();
    adamw.load_shard_state({{"exp_avg", whole.exp_avg.narrow(owned.begin, owned.size())},
                            {"exp_avg_sq", whole.exp_avg_sq.narrow(owned.begin, owned.size())}},
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
