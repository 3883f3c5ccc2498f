#include "moe/moe_layer.h"

#include <cmath>

#include "autograd/ops.h"
#include "moe/dispatch.h"
#include "moe/ops.h"
#include "tensor/error.h"
#include "tensor/kernels.h"

namespace lt {
MoEBlock::MoEBlock(const MoESettings& s, double init_std, Rng& rng) : settings_(s) {
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
  // The router weight is a bare nn.Parameter in the Hugging Face code and keeps PyTorch's default
  // kaiming_uniform(a = sqrt(5)) initialisation: Uniform(-1/sqrt(H), 1/sqrt(H))
  // (docs/architecture.md §5).
  const double bound = 1.0 / std::sqrt(static_cast<double>(H));
  gate_weight_EH_ = &add_module("gate", std::make_unique<WeightModule>(Tensor::uniform({E, H}, rng, -bound, bound), true)).weight;
  // The routed experts are stored stacked, [E, out, in] per projection, gate and up fused into one
  // ([E, 2I, H]: nn/layers.h init_gate_up), so that a grouped matmul reads one tensor per product;
  // model/hf_names.cpp maps them to the per-expert Hugging Face names.
  // Under expert parallelism every rank draws all E experts, as one process does, and keeps its own L:
  // the same initial model whatever the layout, at the cost of one layer's experts drawn at a time.
  const ExpertSlice& slice = s.experts;
  LT_CHECK(slice.ranks >= 1 && E % slice.ranks == 0 && slice.rank >= 0 && slice.rank < slice.ranks, "MoE layer ",
           s.layer, ": ", E, " experts do not split over ", slice.ranks, " expert-parallel ranks");
  auto held = [&](const Tensor& all_E) {
    return slice.ranks == 1 ? all_E : all_E.narrow(slice.first(E), slice.held(E)).clone();
  };
  gate_up_proj_L2IH_ =
      &add_module("experts.gate_up_proj",
                  std::make_unique<WeightModule>(held(init_gate_up({E, I, H}, init_std, rng)), true))
           .weight;
  down_proj_LHI_ =
      &add_module("experts.down_proj",
                  std::make_unique<WeightModule>(held(init_normal({E, H, I}, init_std, rng)), true))
           .weight;
  router_warmup_ = &add_buffer("router_warmup", routing_warmup_stats());
  router_warmup_observations_ = &add_buffer("router_warmup_observations", Tensor::zeros({3}, DType::F64));
  if (s.num_shared > 0)
    shared_experts_ = &add_module("shared_experts", std::make_unique<SwiGLUMLP>(H, I * s.num_shared, init_std, rng));
}

Variable MoEBlock::forward(const Variable& x_BTH, MoEContext& context) {
  const int64_t B = x_BTH.dim(0), T = x_BTH.dim(1), H = x_BTH.dim(2), N = B * T, k = settings_.top_k;
  const Variable x_NH = reshape(x_BTH, {N, H});

  RouterSettings router;
  router.top_k = k;
  router.norm_topk_prob = settings_.norm_topk_prob;
  router.aux_loss_coef = settings_.aux_loss_coef;
  router.z_loss_coef = settings_.z_loss_coef;
  router.warmup_steps = context.warmup_steps;
  router.step = context.step;
  router.training = context.training;
  router.noise_seed = context.noise_seed;
  router.layer = settings_.layer;
  router.first_sequence = context.first_sequence;
  router.tokens_per_sequence = T;
  const Routing routing = route(x_NH, *gate_weight_EH_, router, *router_warmup_, router_warmup_observations_);
  context.aux_losses.push_back(routing.aux_loss);
  if (context.routing_trace != nullptr)
    context.routing_trace->push_back({routing.expert_ids.to(Device::cpu()), routing.weights.value().to(Device::cpu()),
                                      routing.probs.to(Device::cpu()), routing.lse.to(Device::cpu())});

  LT_CHECK(expert_group_ != nullptr || settings_.experts.ranks == 1, "MoE layer ", settings_.layer,
           ": it holds a slice of its experts but has no expert-parallel group to reach the others");
  const DispatchPlan plan = plan_dispatch(routing.expert_ids, settings_.num_experts);
  context.stats.push_back(expert_stats(routing, plan));
  Variable out_NH = expert_group_ != nullptr ? expert_parallel_experts(x_NH, routing.weights, plan, *gate_up_proj_L2IH_,
                                                                       *down_proj_LHI_, *expert_group_)
                                             : moe_experts(x_NH, routing.weights, plan, *gate_up_proj_L2IH_,
                                                           *down_proj_LHI_);
  // The shared experts' down projection adds the routed experts' sum as it writes its result.
  if (shared_experts_ != nullptr) out_NH = shared_experts_->forward(x_NH, out_NH);
  return reshape(out_NH, {B, T, H});
}

void MoEBlock::fold_routing_warmup() {
  kernels::routing_warmup_fold(*router_warmup_observations_, kRoutingWarmupMomentum, *router_warmup_);
}

}  // namespace lt
