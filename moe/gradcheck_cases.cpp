#include "moe/gradcheck_cases.h"

#include "autograd/ops.h"
#include "moe/dispatch.h"
#include "moe/expert_parallel.h"
#include "moe/moe_layer.h"
#include "moe/ops.h"

namespace lt {
namespace {

using Inputs = std::vector<Variable>;

// A constant random tensor (the same for every call with the same shape).
Variable fixed_projection(const Shape& shape) {
  Rng rng(99);
  return Variable(Tensor::randn(shape, rng, 1.0, DType::F64));
}

// The router's weights and auxiliary loss for x [N, H] and gate [E, H], with the warmup noise drawn
// from a fixed seed and fixed running statistics so every forward is the same function of the inputs.
Variable routed_output(const Inputs& x, int64_t k, bool norm, int64_t warmup_steps, int64_t step, double aux_coef,
                       double z_coef) {
  RouterSettings s;
  s.top_k = k;
  s.norm_topk_prob = norm;
  s.aux_loss_coef = aux_coef;
  s.z_loss_coef = z_coef;
  s.warmup_steps = warmup_steps;
  s.step = step;
  s.training = true;
  Tensor warmup = Tensor::from_vector<double>({3}, {0.3, 0.7, 1.0});  // mean, std, observed
  s.noise_seed = 11;
  const Routing r = route(x[0], x[1], s, warmup, nullptr);
  // One scalar over every differentiable path: each weight (through a fixed random projection, as
  // their row sums are constant) and the auxiliary loss.
  return add(sum(mul(r.weights, fixed_projection(r.weights.shape()))), r.aux_loss);
}

}  // namespace

std::vector<GradCase> moe_gradcheck_cases() {
  std::vector<GradCase> cases;
  // The routed experts: x [N, H], weights [N, k], gate_up [E, 2I, H], down [E, H, I]; an expert
  // that receives no token, and k = 1.
  struct ExpertsCase {
    int64_t N, H, E, I, k;
    std::vector<int32_t> ids;  // [N, k], distinct experts per token as top-k picks them
    std::string what;
  };
  for (const ExpertsCase& ec : std::vector<ExpertsCase>{
           {5, 3, 4, 2, 2, {0, 2, 2, 3, 0, 3, 3, 2, 2, 0}, "N=5 H=3 E=4 I=2 k=2, expert 1 idle"},
           {17, 4, 3, 5, 1, {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 1, 1}, "N=17 H=4 E=3 I=5 k=1"}}) {
    const DispatchPlan plan = plan_dispatch(Tensor::from_vector<int32_t>({ec.N, ec.k}, ec.ids), ec.E);
    cases.push_back(simple("moe_experts", ec.what,
                           {{ec.N, ec.H}, {ec.N, ec.k}, {ec.E, 2 * ec.I, ec.H}, {ec.E, ec.H, ec.I}},
                           [plan](const Inputs& x) { return moe_experts(x[0], x[1], plan, x[2], x[3]); }));
    // The same through the expert-parallel path, on a group of one rank (the exchange across ranks is
    // checked in tests/mpi/test_expert_exchange.cpp): rows out by the exchange, the experts' SwiGLU with
    // the routing weights sent along in the backward, back, and combined.
    cases.push_back(simple("expert_parallel_experts", ec.what + ", one rank",
                           {{ec.N, ec.H}, {ec.N, ec.k}, {ec.E, 2 * ec.I, ec.H}, {ec.E, ec.H, ec.I}},
                           [plan](const Inputs& x) {
                             LocalExpertGroup group;
                             return expert_parallel_experts(x[0], x[1], plan, x[2], x[3], group);
                           }));
  }
  // Permute/unpermute: gather by the plan's token order, scatter-add back.
  cases.push_back(simple("permute_unpermute", "17 tokens, k=3 of 5 experts", {{17, 3}}, [](const Inputs& x) {
    std::vector<int32_t> ids;
    for (int n = 0; n < 17; ++n)
      for (int j = 0; j < 3; ++j) ids.push_back(static_cast<int32_t>((n * 7 + j * 2) % 5));
    const DispatchPlan plan = plan_dispatch(Tensor::from_vector<int32_t>({17, 3}, ids), 5);
    const Variable permuted = gather_rows(x[0], plan.token_of);
    return scatter_add_rows(mul(permuted, permuted), plan.token_of, 17);
  }));
  struct RouterCase {
    int64_t k;
    bool norm;
    double aux_coef, z_coef;
  };
  for (const RouterCase& rc : std::vector<RouterCase>{{1, true, 1.0, 1.0}, {2, true, 1.0, 1.0}, {3, false, 1.0, 1.0},
                                                      {2, true, 0.3, 2.0}}) {
    const std::string variant = "N=17 H=3 E=5 k=" + std::to_string(rc.k) + (rc.norm ? " renorm" : "") +
                                " aux " + std::to_string(rc.aux_coef) + " z " + std::to_string(rc.z_coef);
    cases.push_back(simple("router", variant, {{17, 3}, {5, 3}}, [rc](const Inputs& x) {
      return routed_output(x, rc.k, rc.norm, 0, 0, rc.aux_coef, rc.z_coef);
    }));
  }
  // Large logits (x scaled by 30): the z-loss and the softmax far from uniform.
  cases.push_back(simple("router", "large logits, k=2", {{17, 3}, {5, 3}}, [](const Inputs& x) {
    return routed_output({scale(x[0], 30.0), x[1]}, 2, true, 0, 0, 1.0, 1.0);
  }));
  cases.push_back(simple("router_warmup", "alpha 0.25 (step 1 of 4), k=2", {{17, 3}, {5, 3}},
                         [](const Inputs& x) { return routed_output(x, 2, true, 4, 1, 1.0, 1.0); }));
  // The whole block: the input and every parameter (router, stacked experts, shared expert) are
  // checked. The block is built once; its f64 parameters are the case's inputs, so perturbing an
  // input perturbs the block.
  auto block = std::make_shared<std::unique_ptr<MoEBlock>>();
  cases.push_back({"moe_block", "B=2 T=3 H=4 E=4 I=5 k=2 shared=1",
                   [block](Rng& rng) {
                     Rng init_rng(3);
                     *block = std::make_unique<MoEBlock>(MoESettings{4, 5, 4, 2, 1, true, 0.015, 1e-4, 0, {}}, 0.5,
                                                         init_rng);
                     Inputs inputs{grad_input({2, 3, 4}, rng)};
                     for (const Parameter& p : (*block)->parameters()) {
                       p.value->value() = p.value->value().to(DType::F64);
                       inputs.push_back(*p.value);
                     }
                     return inputs;
                   },
                   [block](const Inputs& x) {
                     MoEContext context;
                     const Variable y = (*block)->forward(x[0], context);
                     return add(sum(mul(y, fixed_projection(y.shape()))), context.aux_losses[0]);
                   }});
  return cases;
}

}  // namespace lt
