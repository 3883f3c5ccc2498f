// What a training layout needs, counted from the model's shapes and the layout alone, nothing allocated
// (`lingtrain plan`): the memory of each rank (weights, gradients, AdamW state, the bf16 weight copy,
// the activations a step keeps for its backward and the largest transient) and the bytes each of its
// collectives sends per step, counted as the communicator counts them (dist/communicator.h:
// bytes_sent). So Ling-Plus can be planned on a laptop.
//
// The layouts: N ranks in data parallel (every rank a whole copy) or EDiT (replicas of S ranks sharing
// gradients and AdamW state, ZeRO-2); expert parallelism over E ranks (each rank holds 1/E of every
// MoE layer's routed experts; tokens travel to their experts by all-to-all); parameter sharding (each
// rank holds 1/D of the values, gradients and AdamW state, D the ranks of a data-parallel group or of an
// EDiT replica; a layer gathered for its forward and its backward, once per micro-batch); the trainer
// runs each of them.
#pragma once
#include <cstdint>
#include <string>

#include "io/json.h"
#include "model/config.h"
#include "tensor/dtype.h"

namespace lt {

struct PlanLayout {
  int64_t ranks = 1;
  int64_t expert_parallel = 1;
  bool shard_params = false;
  bool edit = false;         // --dist edit / aedit: replicas of shard_group ranks
  int64_t shard_group = 1;   // EDiT: ranks per replica
  int64_t sync_interval = 10;  // EDiT: steps between syncs (for the bytes per step)
};

struct PlanShape {
  int64_t batch = 1, seq = 1;  // per rank
  DType matmul_dtype = DType::F32;  // bf16: mixed precision
  bool on_gpu = false;              // the weights' bf16 copy exists on a GPU only
};

// Bytes of one rank.
struct RankMemory {
  int64_t params = 0;  // parameters this rank holds (counts, not bytes)
  int64_t weights = 0, gradients = 0, adamw = 0, bf16_copy = 0, gathered = 0;
  int64_t activations = 0, transient = 0;
  int64_t held() const { return weights + gradients + adamw + bf16_copy; }
  int64_t peak() const { return held() + gathered + activations + transient; }
};

// Bytes one rank sends per step, by collective.
struct StepTraffic {
  int64_t gradient_all_reduce = 0;  // data parallel (the replicated parameters over all ranks, the experts
                                    // over their copies); EDiT: each step of its warmup (then edit_sync)
  int64_t parameter_all_gather = 0, gradient_reduce_scatter = 0;  // sharding (ZeRO-2 in EDiT, ZeRO-3)
  int64_t expert_all_to_all = 0;    // tokens to their experts and back, forward and backward (with their
                                    // routing weights, and each layer's row counts)
  int64_t edit_sync = 0;            // EDiT after its warmup: a sync's traffic over sync_interval steps
  int64_t replica_all_reduce = 0;   // EDiT with expert-parallel replicas: the replicated parameters'
                                    // gradients averaged over the replica's ranks every step
};

struct Plan {
  int64_t total_params = 0, routed_expert_params = 0;
  RankMemory memory;
  StepTraffic traffic;
  Json to_json() const;
};

// Checks the layout against the model first (one clear line: ranks not divisible by the degrees, experts
// not divisible by the expert-parallel degree, a dense model split by experts).
Plan plan_training(const LingConfig& config, const PlanLayout& layout, const PlanShape& shape);

}  // namespace lt
