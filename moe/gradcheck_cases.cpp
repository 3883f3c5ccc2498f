#include "moe/gradcheck_cases.h"

#include "autograd/ops.h"
#include "moe/dispatch.h"
#include "moe/moe_layer.h"
#include "moe/ops.h"

namespace lt {
namespace {

using Inputs = std::vector<Variable>;

GradCase simple(std::string op, std::string variant, std::vector<Shape> shapes,
                std::function<Variable(const Inputs&)> forward) {
  return {std::move(op), std::move(variant),
          [shapes](Rng& rng) {
            Inputs inputs;
            for (const Shape& s : shapes) inputs.push_back(grad_input(s, rng));
            return inputs;
          },
          std::move(forward)};
}

// Positive values bounded away from 0, as top-k router probabilities are.
GradCase positive(std::string op, std::string variant, Shape shape, std::function<Variable(const Inputs&)> forward) {
  return {std::move(op), std::move(variant),
          [shape](Rng& rng) { return Inputs{Variable(Tensor::uniform(shape, rng, 0.2, 1.0, DType::F64), true)}; },
          std::move(forward)};
}

// A constant random tensor (the same for every call with the same shape).
Variable fixed_projection(const Shape& shape) {
  Rng rng(99);
  return Variable(Tensor::randn(shape, rng, 1.0, DType::F64));
}

// The router's weights (and, through `extra`, its losses) for x [N, H] and gate [E, H], with the
// warmup noise drawn from a fixed seed and fixed running statistics so every forward is the same
// function of the inputs.
Variable routed_output(const Inputs& x, int64_t k, bool norm, int64_t warmup_steps, int64_t step) {
  RouterSettings s;
  s.top_k = k;
  s.norm_topk_prob = norm;
  s.warmup_steps = warmup_steps;
  s.step = step;
  s.training = true;
  s.update_warmup_stats = false;
  RoutingWarmup warmup;
  warmup.mean = 0.3;
  warmup.std = 0.7;
  warmup.initialized = true;
  Rng rng(11);
  const Routing r = route(x[0], x[1], s, warmup, rng);
  // One scalar over every differentiable path: each weight (through a fixed random projection, as
  // their row sums are constant), the balance loss and the z-loss.
  const Variable losses = add(load_balance_loss(r.probs, r.expert_counts, k), router_z_loss(r.logits));
  return add(sum(mul(r.weights, fixed_projection(r.weights.shape()))), losses);
}

}  // namespace

std::vector<GradCase> moe_gradcheck_cases() {
  std::vector<GradCase> cases;
  cases.push_back(positive("normalize_rows", "[17, 3]", {17, 3}, [](const Inputs& x) { return normalize_rows(x[0]); }));
  cases.push_back(positive("normalize_rows", "[3, 1]", {3, 1}, [](const Inputs& x) { return normalize_rows(x[0]); }));
  cases.push_back(simple("router_z_loss", "[17, 3]", {{17, 3}}, [](const Inputs& x) { return router_z_loss(x[0]); }));
  cases.push_back(simple("router_z_loss", "[3, 129] large logits", {{3, 129}},
                         [](const Inputs& x) { return router_z_loss(scale(x[0], 30.0)); }));
  cases.push_back(positive("load_balance_loss", "[17, 3] counts", {17, 3}, [](const Inputs& x) {
    return load_balance_loss(softmax(x[0]), {20, 9, 5}, 2);
  }));
  cases.push_back(simple("scale_rows", "[17, 129] * [17]", {{17, 129}, {17}},
                         [](const Inputs& x) { return scale_rows(x[0], x[1]); }));
  cases.push_back(simple("grouped_matmul", "4 experts, one empty, [17,3]->[17,5]", {{17, 3}, {4, 5, 3}},
                         [](const Inputs& x) { return grouped_matmul(x[0], x[1], {0, 6, 6, 16, 17}); }));
  cases.push_back(simple("grouped_matmul", "1 expert [3,129]->[3,1]", {{3, 129}, {1, 1, 129}},
                         [](const Inputs& x) { return grouped_matmul(x[0], x[1], {0, 3}); }));
  // Permute/unpermute: gather by the plan's token order, scatter-add back.
  cases.push_back(simple("permute_unpermute", "17 tokens, k=3 of 5 experts", {{17, 3}}, [](const Inputs& x) {
    std::vector<int32_t> ids;
    for (int n = 0; n < 17; ++n)
      for (int j = 0; j < 3; ++j) ids.push_back(static_cast<int32_t>((n * 7 + j * 2) % 5));
    const DispatchPlan plan = plan_dispatch(Tensor::from_vector<int32_t>({17, 3}, ids), 5);
    const Variable permuted = gather_rows(x[0], plan.token_of);
    return scatter_add_rows(mul(permuted, permuted), plan.token_of, 17);
  }));
  for (auto [k, norm] : std::vector<std::pair<int64_t, bool>>{{1, true}, {2, true}, {3, false}}) {
    const std::string variant = "N=17 H=3 E=5 k=" + std::to_string(k) + (norm ? " renorm" : "");
    cases.push_back(simple("router", variant, {{17, 3}, {5, 3}},
                           [k, norm](const Inputs& x) { return routed_output(x, k, norm, 0, 0); }));
  }
  cases.push_back(simple("router_warmup", "alpha 0.25 (step 1 of 4), k=2", {{17, 3}, {5, 3}},
                         [](const Inputs& x) { return routed_output(x, 2, true, 4, 1); }));
  // The whole block: the input and every parameter (router, stacked experts, shared expert) are
  // checked. The block is built once; its f64 parameters are the case's inputs, so perturbing an
  // input perturbs the block.
  auto block = std::make_shared<std::unique_ptr<MoEBlock>>();
  cases.push_back({"moe_block", "B=2 T=3 H=4 E=4 I=5 k=2 shared=1",
                   [block](Rng& rng) {
                     Rng init_rng(3);
                     *block = std::make_unique<MoEBlock>(MoESettings{4, 5, 4, 2, 1, true, 0.015, 1e-4}, 0.5, init_rng);
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
