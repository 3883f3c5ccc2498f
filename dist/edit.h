// EDiT: local SGD over a 2-D mesh of processes, with layer-wise synchronisation and a penalty on
// outlying pseudo-gradients (docs/distributed.md; spec: Cheng et al. 2024 and the Ling report §2.2).
//
// The mesh. The world's ranks form replicas of S consecutive ranks (the shard group, --shard-group S):
// the ranks of a replica hold one copy of the model and split its gradients and optimiser state ZeRO-2
// style — after the backward the gradients are reduce-scattered (each rank receives the mean of its
// shard), each rank updates its shard with AdamW, and the updated shards are all-gathered. Under
// --shard-params they hold parts of every layer instead (ZeRO-3, dist/parameter_shards.h: a layer gathered
// for its uses, its gradients reduce-scattered as the backward goes). The ranks with the same shard index
// across replicas form a sync group.
//
// Inner steps touch only the shard group (during the first --local-sgd-warmup steps the gradient shard
// is also averaged across the sync group: plain synchronous training). Every --sync-interval steps
// (or, in A-EDiT, when a timer fires) the replicas synchronise, layer by layer in forward order, each
// rank on its own shard of each layer:
//   pseudo-gradient   Delta_m = anchor - current (the anchor: the parameters after the last sync)
//   norm              G_m = ||Delta_m|| over the whole layer (squared parts summed across the shard group)
//   anomaly           an outlying G_m (a one-sided EWMA detector per layer) drops Delta_m
//   weights           w_m = softmax(-G_m / T) over the replicas (or equal); A-EDiT may mix in each
//                     replica's share of the steps taken
//   reduce            Delta = sum_m w_m Delta_m / sum_m w_m, summed across the sync group
//   clip              Delta scaled to norm <= phi (the norm again over the whole layer)
//   outer update      anchor moved by Delta: SGD with Nesterov momentum, or plain averaging (anchor -= Delta)
//   and the anchor becomes the current parameters.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/data_parallel.h"
#include "dist/edit_math.h"
#include "io/json.h"
#include "optim/flat_parameters.h"

namespace lt {

// Every knob with the reference implementation's default (spec §13.5), so `--dist edit` alone is
// local SGD with plain averaging at every step.
struct EditSettings {
  int shard_group = 1;            // ranks per replica (ZeRO-2 shards)
  int64_t local_sgd_warmup = 0;   // steps with gradients averaged across replicas before local steps begin
  int64_t sync_interval = 1;      // EDiT: a sync every this many steps
  // A-EDiT: a sync when sync_seconds have passed since the last one, unless the replicas took fewer than
  // min_total_steps steps between them (the timer then restarts).
  bool time_based = false;
  double sync_seconds = 600;
  int64_t min_total_steps = 100;
  bool step_weight = false;        // A-EDiT: mix each replica's share of the steps into its weight
  double step_weight_ratio = 0.5;  // weight = (1 - r) w_norm + r w_steps
  bool weight_by_norm = false;     // softmax(-G / T) weights (else equal)
  double temperature = 1.0;
  bool skip_anomaly = false;
  AnomalyDetector::Settings detector;
  double clip_pseudo_grad = 0;  // phi; 0: no clipping
  bool outer_sgd = false;       // the outer optimizer; false: plain averaging
  OuterSgd outer;

  Json to_json() const;
  // The settings to_json wrote (a checkpoint's); errors name `source`.
  static EditSettings from_json(const Json& json, const std::string& source);
};

// The mesh of one process: its replica (row) and shard (column), and the two groups. Under expert
// parallelism (--expert-parallel G) a replica is one expert-parallel group of G consecutive ranks, not
// sharded (each shard group is one rank), and the sync group joins the ranks that hold the same experts.
struct EditMesh {
  std::unique_ptr<Communicator> shard_group, sync_group;
  std::unique_ptr<Communicator> expert_group;  // under expert parallelism: the replica's ranks
  // The ranks of this process's replica, which step together (A-EDiT's rounds decide over them).
  Communicator& replica_group() const { return expert_group ? *expert_group : *shard_group; }
  int shard() const { return shard_group->rank(); }
  int shards() const { return shard_group->size(); }
  int replica() const { return sync_group->rank(); }
  int replicas() const { return sync_group->size(); }
  // Collective over the world; shard_group_size (or expert_parallel) must divide the world size.
  static EditMesh build(Communicator& world, int shard_group_size, int expert_parallel = 1);
};

// What one synchronisation did, summed over its layers.
struct SyncReport {
  int64_t layers = 0;
  int64_t dropped = 0;         // (layer, replica) pseudo-gradients dropped as anomalies
  int64_t skipped_layers = 0;  // layers whose every replica was dropped: no update
  double mean_norm = 0;        // this replica's pseudo-gradient norm, mean over layers
  double seconds = 0;
};

class Edit {
 public:
  // `params` is laid out for mesh.shards() shards and this rank owns shard mesh.shard() (the trainer's
  // sharded AdamW, trainer/trainer.h), or under parameter sharding holds part mesh.shard() of every layer
  // (dist/parameter_shards.h, which reduces the gradients); `model` owns the buffers to keep in step.
  // Under expert parallelism (mesh.expert_group) the replica's ranks hold different routed experts, the
  // stretches `expert_ranges` of the flat buffers (sorted), and the same everything else.
  Edit(EditMesh mesh, EditSettings settings, FlatParameters& params, Module& model,
       std::vector<FlatParameters::Range> expert_ranges = {});

  const EditMesh& mesh() const { return mesh_; }
  const EditSettings& settings() const { return settings_; }

  // The inner step's hooks (trainer/trainer.h).
  void reduce_gradients(int64_t step);               // after_backward
  double complete_grad_sum_squares(double own);      // the gradient norm across the shard group
  void share_updated_shard();                        // after_update

  // Step-based EDiT: whether a sync is due once `steps` steps have been taken (every sync_interval
  // steps after the warmup).
  bool sync_due(int64_t steps) const;
  // Synchronises the replicas (collective over the world). local_steps: this replica's steps since the
  // last sync (A-EDiT's step weighting). The first call takes the anchor and changes nothing.
  SyncReport sync(int64_t local_steps);
  bool has_anchor() const { return anchor_.defined(); }

  // The bytes this rank has sent through the mesh's groups.
  int64_t bytes_sent() const {
    return mesh_.shard_group->bytes_sent() + mesh_.sync_group->bytes_sent() +
           (mesh_.expert_group ? mesh_.expert_group->bytes_sent() : 0);
  }

  // This rank's share of the state a resume needs: the owned shard of the anchor and of the outer
  // momentum (flat tensors) and the detectors and flags (JSON).
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  Json state_json() const;
  void load_state(const std::map<std::string, Tensor>& tensors, const Json& json, const std::string& origin);

 private:
  // The layer ranges clipped to this rank's shard, in the shard's coordinates.
  struct LayerPart {
    int64_t begin = 0, end = 0;  // within the owned shard
  };
  Tensor owned_values() const;
  void average_buffers(Communicator& comm);

  // Each layer's squared norm of `flat` (this rank's owned part of it), whole over the replica: the
  // shards' parts summed, or under expert parallelism the experts' parts summed over the group.
  std::vector<double> layer_sum_squares(const Tensor& flat);

  EditMesh mesh_;
  EditSettings settings_;
  FlatParameters& params_;
  Module& model_;
  std::vector<FlatParameters::Range> expert_ranges_;
  // Under expert parallelism: the inner step's gradient average over the replica (the expert-parallel
  // group), data parallel's with its experts.
  std::unique_ptr<DataParallel> replica_;
  FlatParameters::Range owned_;
  std::vector<LayerPart> parts_;
  std::vector<AnomalyDetector> detectors_;  // one per layer (used with skip_anomaly)
  std::vector<bool> momentum_started_;      // per layer: the outer momentum buffer holds a value
  Tensor anchor_, momentum_, delta_, gathered_;  // [owned] each (gathered_: the all-gather's input)
};

}  // namespace lt
