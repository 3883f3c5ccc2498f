#include "dist/edit.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "tensor/kernels.h"

namespace lt {

Json EditSettings::to_json() const {
  return Json{{"shard_group", shard_group},
              {"local_sgd_warmup", local_sgd_warmup},
              {"sync_interval", sync_interval},
              {"time_based", time_based},
              {"sync_seconds", sync_seconds},
              {"min_total_steps", min_total_steps},
              {"step_weight", step_weight},
              {"step_weight_ratio", step_weight_ratio},
              {"weight_by_norm", weight_by_norm},
              {"temperature", temperature},
              {"skip_anomaly", skip_anomaly},
              {"ewma_alpha", detector.alpha},
              {"ewma_warmup_steps", detector.warmup_steps},
              {"ewma_threshold", detector.threshold},
              {"clip_pseudo_grad", clip_pseudo_grad},
              {"outer_optimizer", outer_sgd ? "sgd" : "average"},
              {"outer_lr", outer.lr},
              {"outer_momentum", outer.momentum},
              {"outer_nesterov", outer.nesterov}};
}

EditSettings EditSettings::from_json(const Json& json, const std::string& source) {
  const JsonObject o(json, source);
  EditSettings e;
  e.shard_group = o.get<int>("shard_group", e.shard_group);
  e.local_sgd_warmup = o.get<int64_t>("local_sgd_warmup", e.local_sgd_warmup);
  e.sync_interval = o.get<int64_t>("sync_interval", e.sync_interval);
  e.time_based = o.get<bool>("time_based", e.time_based);
  e.sync_seconds = o.get<double>("sync_seconds", e.sync_seconds);
  e.min_total_steps = o.get<int64_t>("min_total_steps", e.min_total_steps);
  e.step_weight = o.get<bool>("step_weight", e.step_weight);
  e.step_weight_ratio = o.get<double>("step_weight_ratio", e.step_weight_ratio);
  e.weight_by_norm = o.get<bool>("weight_by_norm", e.weight_by_norm);
  e.temperature = o.get<double>("temperature", e.temperature);
  e.skip_anomaly = o.get<bool>("skip_anomaly", e.skip_anomaly);
  e.detector.alpha = o.get<double>("ewma_alpha", e.detector.alpha);
  e.detector.warmup_steps = o.get<int64_t>("ewma_warmup_steps", e.detector.warmup_steps);
  e.detector.threshold = o.get<double>("ewma_threshold", e.detector.threshold);
  e.clip_pseudo_grad = o.get<double>("clip_pseudo_grad", e.clip_pseudo_grad);
  const std::string outer = o.get<std::string>("outer_optimizer", "average");
  LT_CHECK(outer == "average" || outer == "sgd", source, ": outer_optimizer must be average or sgd, got '", outer, "'");
  e.outer_sgd = outer == "sgd";
  e.outer.lr = o.get<double>("outer_lr", e.outer.lr);
  e.outer.momentum = o.get<double>("outer_momentum", e.outer.momentum);
  e.outer.nesterov = o.get<bool>("outer_nesterov", e.outer.nesterov);
  LT_CHECK(e.shard_group >= 1 && e.sync_interval >= 1 && e.sync_seconds > 0, source,
           ": shard_group and sync_interval must be >= 1, sync_seconds > 0");
  return e;
}

EditMesh EditMesh::build(Communicator& world, int shard_group_size, int expert_parallel) {
  LT_CHECK(shard_group_size >= 1 && world.size() % shard_group_size == 0, "--shard-group ", shard_group_size,
           " must divide the number of ranks (", world.size(), ")");
  EditMesh mesh;
  if (expert_parallel > 1) {
    LT_CHECK(shard_group_size == 1, "--shard-group ", shard_group_size, " with --expert-parallel ", expert_parallel,
             ": a replica is its expert-parallel group, not sharded further (yet)");
    LT_CHECK(world.size() % expert_parallel == 0, "--expert-parallel ", expert_parallel,
             " must divide the number of ranks (", world.size(), ")");
    mesh.shard_group = world.split(world.rank(), world.rank());
    mesh.sync_group = world.split(world.rank() % expert_parallel, world.rank());
    mesh.expert_group = world.split(world.rank() / expert_parallel, world.rank());
    return mesh;
  }
  // Consecutive ranks share a replica: on a cluster they are the ranks of one node, where the shard
  // group's per-step traffic is cheapest.
  mesh.shard_group = world.split(world.rank() / shard_group_size, world.rank());
  mesh.sync_group = world.split(world.rank() % shard_group_size, world.rank());
  return mesh;
}

Edit::Edit(EditMesh mesh, EditSettings settings, FlatParameters& params, Module& model,
           std::vector<FlatParameters::Range> expert_ranges)
    : mesh_(std::move(mesh)),
      settings_(settings),
      params_(params),
      model_(model),
      expert_ranges_(std::move(expert_ranges)),
      owned_(params.sharded_by_layer() ? params.shard(0, 1) : params.shard(mesh_.shard(), mesh_.shards())) {
  LT_CHECK(settings_.sync_interval >= 1, "--sync-interval must be >= 1, got ", settings_.sync_interval);
  LT_CHECK(settings_.local_sgd_warmup >= 0, "--local-sgd-warmup must be >= 0, got ", settings_.local_sgd_warmup);
  LT_CHECK(settings_.temperature > 0, "--weight-temperature must be > 0, got ", settings_.temperature);
  LT_CHECK(settings_.clip_pseudo_grad >= 0, "--clip-pseudo-grad must be >= 0, got ", settings_.clip_pseudo_grad);
  LT_CHECK(settings_.step_weight_ratio >= 0 && settings_.step_weight_ratio <= 1,
           "--step-weight-ratio must be in [0, 1], got ", settings_.step_weight_ratio);
  LT_CHECK(settings_.detector.alpha > 0 && settings_.detector.alpha <= 1 && settings_.detector.warmup_steps >= 0 &&
               settings_.detector.threshold > 0,
           "the anomaly detector needs 0 < --ewma-alpha <= 1, --ewma-warmup >= 0 and --ewma-threshold > 0");
  const int64_t n = owned_.size();
  if (params_.sharded_by_layer()) {
    // This rank's parts of a layer's units are adjacent in what it holds.
    parts_.assign(params_.layers().size(), LayerPart{});
    for (const FlatParameters::Unit& unit : params_.units()) {
      LayerPart& part = parts_[unit.layer];
      if (part.end == part.begin) part.begin = unit.held.begin;
      part.end = unit.held.end;
    }
  } else {
    for (const FlatParameters::Range& layer : params_.layers())
      parts_.push_back({std::clamp(layer.begin - owned_.begin, int64_t{0}, n),
                        std::clamp(layer.end - owned_.begin, int64_t{0}, n)});
  }
  detectors_.assign(parts_.size(), AnomalyDetector(settings_.detector));
  momentum_started_.assign(parts_.size(), false);
  const Tensor& values = params_.values();
  delta_ = Tensor::zeros({n}, values.dtype(), values.device());
  if (mesh_.shards() > 1 && !params_.sharded_by_layer())
    gathered_ = Tensor::zeros({n}, values.dtype(), values.device());
  if (mesh_.expert_group && !params_.sharded_by_layer()) {
    LT_CHECK(mesh_.shards() == 1, "EDiT: a replica of expert-parallel ranks is not sharded");
    replica_ = std::make_unique<DataParallel>(*mesh_.expert_group);
    replica_->set_expert_parallel(*mesh_.expert_group, *mesh_.shard_group, expert_ranges_);
  }
}

Tensor Edit::owned_values() const { return params_.values().narrow(owned_.begin, owned_.size()); }

void Edit::average_buffers(Communicator& comm) {
  if (comm.size() == 1) return;
  for (const Buffer& buffer : model_.buffers()) comm.all_reduce(*buffer.value, ReduceOp::Mean);
}

void Edit::reduce_gradients(int64_t step) {
  Tensor& grads = params_.grads();
  Tensor own = grads.narrow(owned_.begin, owned_.size());
  if (replica_) {
    replica_->average(params_, model_);
  } else if (params_.sharded_by_layer()) {
    average_buffers(mesh_.replica_group());  // the gradients were reduced as the backward went (ParameterShards)
  } else {
    // The reduce-scatter reads the whole buffer before it writes the owned shard, so `own` may alias it.
    if (mesh_.shards() > 1) mesh_.shard_group->reduce_scatter(grads, own, ReduceOp::Mean);
    average_buffers(*mesh_.shard_group);
  }
  if (step < settings_.local_sgd_warmup && mesh_.replicas() > 1) {
    mesh_.sync_group->all_reduce(own, ReduceOp::Mean);
    average_buffers(*mesh_.sync_group);
  }
}

double Edit::complete_grad_sum_squares(double own) {
  if (replica_) return replica_->grad_sum_squares(params_);
  // Every element of the replica's model on one of its ranks (a shard, or a part of each layer).
  Communicator& replica = mesh_.replica_group();
  if (replica.size() == 1) return own;
  Tensor total = Tensor::full({1}, own, DType::F64);
  replica.all_reduce(total, ReduceOp::Sum);
  return total.item();
}

void Edit::share_updated_shard() {
  if (mesh_.shards() == 1 || params_.sharded_by_layer()) return;  // parts are gathered where they are used
  // MPI forbids a send buffer inside the receive buffer: the shard goes out from a copy.
  gathered_.copy_from(owned_values());
  mesh_.shard_group->all_gather(gathered_, params_.values());
}

bool Edit::sync_due(int64_t steps) const {
  return !settings_.time_based && anchor_.defined() && steps > settings_.local_sgd_warmup &&
         (steps - settings_.local_sgd_warmup) % settings_.sync_interval == 0;
}

std::vector<double> Edit::layer_sum_squares(const Tensor& flat) {
  const auto L = static_cast<int64_t>(parts_.size());
  Tensor sum_squares = Tensor::empty({1}, flat.dtype(), flat.device());
  auto of = [&](int64_t begin, int64_t end) {
    kernels::sum_squares(flat.narrow(begin, end - begin), sum_squares);
    return sum_squares.item();
  };
  // Per layer, what the replica's ranks add up (a shard's part; a rank's own experts), and what each of
  // them holds alike (the replicated parameters under expert parallelism), counted once.
  Tensor summed = Tensor::zeros({L}, DType::F64);
  std::vector<double> alike(static_cast<size_t>(L), 0.0);
  double* out = summed.data<double>();
  for (int64_t l = 0; l < L; ++l) {
    const LayerPart& p = parts_[static_cast<size_t>(l)];
    if (p.end == p.begin) continue;
    if (!mesh_.expert_group || params_.sharded_by_layer()) {  // parts the replica's ranks hold once each
      out[l] = of(p.begin, p.end);
      continue;
    }
    for (const FlatPiece& piece : cut_at_experts(p.begin, p.end, expert_ranges_))
      (piece.experts ? out[l] : alike[static_cast<size_t>(l)]) += of(piece.begin, piece.end);
  }
  if (mesh_.shards() > 1) mesh_.shard_group->all_reduce(summed, ReduceOp::Sum);
  if (mesh_.expert_group) mesh_.expert_group->all_reduce(summed, ReduceOp::Sum);
  std::vector<double> whole = summed.to_vector<double>();
  for (int64_t l = 0; l < L; ++l) whole[static_cast<size_t>(l)] += alike[static_cast<size_t>(l)];
  return whole;
}

SyncReport Edit::sync(int64_t local_steps) {
  const auto start = std::chrono::steady_clock::now();
  SyncReport report;
  const int64_t L = static_cast<int64_t>(parts_.size());
  const int R = mesh_.replicas(), me = mesh_.replica();
  report.layers = L;
  Tensor live = owned_values();
  if (!anchor_.defined()) {
    // The replicas are identical until the first sync (one seed; synchronous warmup), so the anchor is
    // this copy and there is nothing to average yet.
    anchor_ = live.clone();
    momentum_ = Tensor::zeros_like(live);
    return report;
  }
  auto part = [&](Tensor& flat, int64_t l) {
    return flat.narrow(parts_[static_cast<size_t>(l)].begin,
                       parts_[static_cast<size_t>(l)].end - parts_[static_cast<size_t>(l)].begin);
  };
  auto empty = [&](int64_t l) { return parts_[static_cast<size_t>(l)].end == parts_[static_cast<size_t>(l)].begin; };

  // 1. Pseudo-gradients and their norms; the detectors judge each norm before they learn it.
  kernels::sub(anchor_, live, delta_);
  const std::vector<double> norms_sq = layer_sum_squares(delta_);
  const int64_t row = 2 * L + 1;
  std::vector<double> mine(static_cast<size_t>(row));
  for (int64_t l = 0; l < L; ++l) {
    const double norm = std::sqrt(norms_sq[static_cast<size_t>(l)]);
    bool dropped = false;
    if (settings_.skip_anomaly) {
      dropped = detectors_[static_cast<size_t>(l)].is_outlier(norm);
      detectors_[static_cast<size_t>(l)].update(norm);
    }
    mine[static_cast<size_t>(l)] = norm;
    mine[static_cast<size_t>(L + l)] = dropped ? 1 : 0;
    report.mean_norm += norm / static_cast<double>(L);
  }
  mine[static_cast<size_t>(2 * L)] = static_cast<double>(local_steps);
  // 2. Every replica's norms, verdicts and step count (a few numbers per layer) to every replica.
  Tensor all = Tensor::empty({row * R}, DType::F64);
  mesh_.sync_group->all_gather(Tensor::from_vector<double>({row}, mine), all);
  const std::vector<double> table = all.to_vector<double>();
  auto at = [&](int m, int64_t i) { return table[static_cast<size_t>(m * row + i)]; };
  double total_steps = 0;
  for (int m = 0; m < R; ++m) total_steps += at(m, 2 * L);

  // 3. Per layer: this replica's weight, the weighted sum over the sync group, then the clip.
  std::vector<bool> skipped(static_cast<size_t>(L), false);
  for (int64_t l = 0; l < L; ++l) {
    std::vector<double> norms(static_cast<size_t>(R));
    std::vector<bool> dropped(static_cast<size_t>(R));
    for (int m = 0; m < R; ++m) {
      norms[static_cast<size_t>(m)] = at(m, l);
      dropped[static_cast<size_t>(m)] = at(m, L + l) != 0;
      report.dropped += dropped[static_cast<size_t>(m)] ? 1 : 0;
    }
    std::vector<double> weights(static_cast<size_t>(R));
    if (settings_.weight_by_norm) {
      weights = pseudo_gradient_weights(norms, dropped, settings_.temperature);
    } else {
      for (int m = 0; m < R; ++m) weights[static_cast<size_t>(m)] = dropped[static_cast<size_t>(m)] ? 0.0 : 1.0;
    }
    if (settings_.step_weight && total_steps > 0)
      for (int m = 0; m < R; ++m)
        if (!dropped[static_cast<size_t>(m)])
          weights[static_cast<size_t>(m)] = (1 - settings_.step_weight_ratio) * weights[static_cast<size_t>(m)] +
                                            settings_.step_weight_ratio * at(m, 2 * L) / total_steps;
    double weight_sum = 0;
    for (double w : weights) weight_sum += w;
    if (weight_sum == 0) {
      skipped[static_cast<size_t>(l)] = true;
      ++report.skipped_layers;
      continue;
    }
    if (empty(l)) continue;
    Tensor d = part(delta_, l);
    kernels::scale(d, weights[static_cast<size_t>(me)] / weight_sum, d);
    if (R > 1) mesh_.sync_group->all_reduce(d, ReduceOp::Sum);
  }
  std::vector<double> clip(static_cast<size_t>(L), 1.0);
  if (settings_.clip_pseudo_grad > 0) {
    const std::vector<double> reduced_sq = layer_sum_squares(delta_);
    for (int64_t l = 0; l < L; ++l)
      clip[static_cast<size_t>(l)] = clip_factor(std::sqrt(reduced_sq[static_cast<size_t>(l)]), settings_.clip_pseudo_grad);
  }

  // 4. The outer update moves the anchor; every replica then continues from it.
  for (int64_t l = 0; l < L; ++l) {
    if (skipped[static_cast<size_t>(l)]) continue;
    if (!empty(l)) {
      Tensor d = part(delta_, l), anchor = part(anchor_, l);
      if (clip[static_cast<size_t>(l)] != 1.0) kernels::scale(d, clip[static_cast<size_t>(l)], d);
      if (settings_.outer_sgd) {
        Tensor momentum = part(momentum_, l);
        settings_.outer.step(anchor, d, momentum, !momentum_started_[static_cast<size_t>(l)]);
      } else {
        kernels::axpy(-1.0, d, anchor);
      }
    }
    momentum_started_[static_cast<size_t>(l)] = true;
  }
  live.copy_from(anchor_);
  share_updated_shard();
  average_buffers(*mesh_.sync_group);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::vector<std::pair<std::string, Tensor>> Edit::state_tensors() const {
  if (!anchor_.defined()) return {};
  return {{"edit.anchor", anchor_}, {"edit.outer_momentum", momentum_}};
}

Json Edit::state_json() const {
  Json detectors = Json::array();
  for (const AnomalyDetector& d : detectors_) detectors.push_back(d.to_json());
  return Json{{"replica", mesh_.replica()},
              {"replicas", mesh_.replicas()},
              {"shard", mesh_.shard()},
              {"shards", mesh_.shards()},
              {"has_anchor", anchor_.defined()},
              {"momentum_started", std::vector<bool>(momentum_started_.begin(), momentum_started_.end())},
              {"detectors", detectors}};
}

void Edit::load_state(const std::map<std::string, Tensor>& tensors, const Json& json, const std::string& origin) {
  const JsonObject o(json, origin);
  for (const char* key : {"replica", "replicas", "shard", "shards"}) {
    const int expected = key == std::string("replica")    ? mesh_.replica()
                         : key == std::string("replicas") ? mesh_.replicas()
                         : key == std::string("shard")    ? mesh_.shard()
                                                          : mesh_.shards();
    LT_CHECK(o.get<int64_t>(key) == expected, origin, ": saved with ", key, " ", o.get<int64_t>(key), ", this run has ",
             expected, " (resume with the same number of ranks and --shard-group)");
  }
  const std::vector<bool> started = json.at("momentum_started").get<std::vector<bool>>();
  LT_CHECK(started.size() == parts_.size() && json.at("detectors").size() == parts_.size(), origin, ": state for ",
           started.size(), " layers, the model has ", parts_.size());
  momentum_started_ = started;
  for (size_t l = 0; l < parts_.size(); ++l)
    detectors_[l] = AnomalyDetector::from_json(json.at("detectors")[l], settings_.detector, origin);
  if (!o.get<bool>("has_anchor")) {
    anchor_ = Tensor();
    return;
  }
  for (auto [name, slot] : {std::pair{"edit.anchor", &anchor_}, std::pair{"edit.outer_momentum", &momentum_}}) {
    auto it = tensors.find(name);
    LT_CHECK(it != tensors.end(), origin, ": no tensor '", name, "'");
    LT_CHECK(it->second.numel() == owned_.size(), origin, ": '", name, "' holds ", it->second.numel(),
             " elements, this rank's shard ", owned_.size());
    *slot = it->second.to(params_.values().dtype()).to(params_.values().device()).reshape({owned_.size()});
  }
}

}  // namespace lt
