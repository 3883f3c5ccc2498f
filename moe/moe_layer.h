// The Ling MoE block (docs/architecture.md §3.7-3.8): a softmax router over E fine-grained experts
// choosing k per token, dropless dispatch, the routed experts as grouped matmuls over contiguous
// segments, the weighted combine, and the ungated shared expert added on top.
#pragma once
#include <memory>
#include <vector>

#include "moe/expert_parallel.h"
#include "moe/router.h"
#include "moe/stats.h"
#include "nn/layers.h"

namespace lt {

// One MoE layer's routing in one forward, kept for inspection (`lingtrain inspect`), on the host.
struct RoutingSnapshot {
  Tensor expert_ids_NK;  // i32: the k chosen experts of each token, best first
  Tensor weights_NK;     // the gating weights of those experts
  Tensor probs_NE;       // softmax over all experts
  Tensor lse_N;          // logsumexp of the router logits: the z whose square the z-loss averages
};

// What one forward pass shares across MoE layers: the step and where its tokens sit in the step's global
// batch (for the routing warmup's noise: moe/router.h), and what the layers hand back (the weighted
// auxiliary losses and router statistics).
struct MoEContext {
  int64_t step = 0;
  bool training = false;
  int64_t warmup_steps = 0;
  uint64_t noise_seed = 0;     // the run's stream for the warmup noise
  int64_t first_sequence = 0;  // the index of this forward's first row in the step's global batch
  std::vector<Variable> aux_losses;  // per MoE layer: aux_coef * balance + z_coef * z
  std::vector<ExpertStats> stats;    // per MoE layer
  // When set, each MoE layer appends its routing here (inspection only: it copies to the host).
  std::vector<RoutingSnapshot>* routing_trace = nullptr;
};

// The routed experts this process holds: all of them, or under expert parallelism (--expert-parallel,
// moe/expert_parallel.h) rank `rank`'s E / ranks consecutive ones of an expert-parallel group of `ranks`.
struct ExpertSlice {
  int64_t rank = 0, ranks = 1;
  int64_t held(int64_t num_experts) const { return num_experts / ranks; }
  int64_t first(int64_t num_experts) const { return rank * held(num_experts); }
};

struct MoESettings {
  int64_t hidden = 0, intermediate = 0, num_experts = 0, top_k = 1, num_shared = 0;
  bool norm_topk_prob = true;
  double aux_loss_coef = 0.015, z_loss_coef = 1e-4;
  int64_t layer = 0;  // the decoder layer (the warmup noise's stream)
  ExpertSlice experts;
};

class MoEBlock : public Module {
 public:
  MoEBlock(const MoESettings& settings, double init_std, Rng& rng);
  Variable forward(const Variable& x_BTH, MoEContext& context);

  const MoESettings& settings() const { return settings_; }
  // The expert-parallel group this block's experts are split over (settings().experts); every forward is
  // then collective over the group. Unset: the block holds all of its experts.
  void set_expert_group(ExpertGroup* group) { expert_group_ = group; }
  // The weights of the load-balance and z losses (post-training may set its own).
  // Folds the step's routing-warmup observations into the statistics (moe/router.h), once its backward
  // is done (and, under data parallel, the buffers averaged).
  void fold_routing_warmup();
  void set_loss_coefficients(double aux_loss_coef, double z_loss_coef) {
    settings_.aux_loss_coef = aux_loss_coef;
    settings_.z_loss_coef = z_loss_coef;
  }

 private:
  MoESettings settings_;
  Variable* gate_weight_EH_;
  // L: the routed experts this block holds (E, or E / ranks under expert parallelism).
  Variable* gate_up_proj_L2IH_;
  Variable* down_proj_LHI_;
  SwiGLUMLP* shared_experts_ = nullptr;
  ExpertGroup* expert_group_ = nullptr;
  Tensor* router_warmup_;  // buffer "router_warmup": the routing-warmup statistics (moe/router.h)
  Tensor* router_warmup_observations_;  // buffer "router_warmup_observations": this step's, until folded
};

}  // namespace lt
