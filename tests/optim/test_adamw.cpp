// AdamW over flat buffers: the parameters become views of one value buffer and their gradients land
// in one gradient buffer, and the fused steps equal per-parameter AdamW with clipping; a parameter
// that received no gradient is left untouched; the moments round-trip through state().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "autograd/ops.h"
#include "optim/adamw.h"
#include "tensor/kernels.h"
#include "tests/test_util.h"

namespace lt {
namespace {

// Three parameters, decayed and not, of sizes that are not multiples of the alignment.
class ThreeParameters : public Module {
 public:
  explicit ThreeParameters(Rng& rng)
      : a(add_parameter("a", Tensor::randn({5, 3}, rng, 1.0, DType::F64), true)),
        b(add_parameter("b", Tensor::randn({7}, rng, 1.0, DType::F64), false)),
        c(add_parameter("c", Tensor::randn({2, 9}, rng, 1.0, DType::F64), true)) {}
  Variable &a, &b, &c;
};

// loss = sum(a^2) + 3 sum(b) + (with_c ? sum(c^3) : 0)
void backward(ThreeParameters& m, bool with_c) {
  Variable loss = add(sum(mul(m.a, m.a)), scale(sum(m.b), 3.0));
  if (with_c) loss = add(loss, sum(mul(m.c, mul(m.c, m.c))));
  loss.backward();
}

TEST(AdamW, FlatStepsEqualPerParameterStepsWithClipping) {
  Rng rng(4), same(4);
  ThreeParameters flat(rng), reference(same);
  AdamWSettings settings;
  FlatParameters flat_params(flat.parameters());
  AdamW optimizer(flat_params, settings);
  EXPECT_TRUE(flat.a.value().shares_storage(flat.c.value()));
  EXPECT_TRUE(flat.a.value().shares_storage(flat.b.value()));

  std::vector<Tensor> m, v;
  for (const Parameter& p : reference.parameters()) {
    m.push_back(Tensor::zeros_like(p.value->value()));
    v.push_back(Tensor::zeros_like(p.value->value()));
  }
  for (int64_t t = 1; t <= 3; ++t) {
    const bool with_c = t != 2;  // c receives no gradient in step 2
    backward(flat, with_c);
    backward(reference, with_c);
    EXPECT_TRUE(flat.a.grad().shares_storage(flat.b.grad()));
    const double norm = std::sqrt(optimizer.grad_sum_squares());
    optimizer.clip_to(norm, 1.0);
    double total = 0;
    for (const Parameter& p : reference.parameters())
      if (p.value->grad().defined())
        for (double g : p.value->grad().to_vector<double>()) total += g * g;
    EXPECT_NEAR(norm, std::sqrt(total), 1e-12);
    const double scale = std::sqrt(total) > 1.0 ? 1.0 / (std::sqrt(total) + 1e-6) : 1.0;
    optimizer.step(0.1);
    const std::vector<Parameter> params = reference.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].value->grad().defined()) continue;
      Tensor g = params[i].value->grad().clone();
      kernels::scale(g, scale, g);
      kernels::adamw_step(params[i].value->value(), g, m[i], v[i],
                          {0.1, settings.beta1, settings.beta2, settings.eps,
                           params[i].weight_decay ? settings.weight_decay : 0.0, t});
    }
    flat_params.zero_grad();
    for (const Parameter& p : reference.parameters()) p.value->zero_grad();
    for (auto [x, y] : {std::pair{&flat.a, &reference.a}, {&flat.b, &reference.b}, {&flat.c, &reference.c}})
      test::expect_close(x->value().to_vector<double>(), y->value().to_vector<double>(), 1e-14, 1e-15,
                         "step " + std::to_string(t));
  }
}

// The kernel over runs: each run has the bits of a step over that run alone, with its decay or none; the
// elements between runs are left as they are; runs out of order, empty or outside are refused.
TEST(AdamW, TheKernelStepsItsRunsEachWithItsDecay) {
  const int64_t n = 40;
  const kernels::AdamWStep step{1e-2, 0.9, 0.95, 1e-8, 0.1, 3, 0.5};
  const Tensor p0 = test::random_tensor({n}, 61), g = test::random_tensor({n}, 62);
  const Tensor m0 = test::random_tensor({n}, 63, DType::F32, 0.1);
  Tensor v0 = Tensor::empty({n});
  kernels::mul(m0, m0, v0);
  const std::vector<kernels::AdamWRun> runs{{2, 9, true}, {9, 20, false}, {25, 40, true}};
  Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
  kernels::adamw_step(p, g, m, v, step, runs);
  Tensor want_p = p0.clone(), want_m = m0.clone(), want_v = v0.clone();
  for (const kernels::AdamWRun& run : runs) {
    kernels::AdamWStep run_step = step;
    run_step.weight_decay = run.weight_decay ? step.weight_decay : 0.0;
    const int64_t size = run.end - run.begin;
    Tensor run_p = want_p.narrow(run.begin, size), run_m = want_m.narrow(run.begin, size),
           run_v = want_v.narrow(run.begin, size);
    kernels::adamw_step(run_p, g.narrow(run.begin, size), run_m, run_v, run_step);
  }
  for (const auto& [got, want] : {std::pair{p, want_p}, std::pair{m, want_m}, std::pair{v, want_v}})
    EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
  for (int64_t i : {0, 1, 20, 24})
    EXPECT_EQ(p.to_vector<float>()[static_cast<size_t>(i)], p0.to_vector<float>()[static_cast<size_t>(i)]) << i;
  for (const std::vector<kernels::AdamWRun>& bad : std::vector<std::vector<kernels::AdamWRun>>{
           {{5, 9, true}, {2, 4, true}}, {{3, 3, false}}, {{30, 41, true}}, {{-1, 4, true}}})
    EXPECT_THROW(kernels::adamw_step(p, g, m, v, step, bad), Error);
}

// The bf16 copy written in the same pass is the rounding convert makes of the new values (nearest even,
// NaN kept NaN), on every Highway target (vector body and scalar tail), and the elements outside the runs
// keep the copy they had; the values and moments are those of the step without a copy.
TEST(AdamW, TheKernelWritesTheBf16CopyOfTheNewValues) {
  const int64_t n = 77;
  const kernels::AdamWStep step{1e-2, 0.9, 0.95, 1e-8, 0.1, 3, 1.0};
  Tensor p0 = test::random_tensor({n}, 71);
  p0.data<float>()[40] = std::nanf("");
  // Values halfway between two bf16 numbers: the rounding to even is what is checked there.
  for (int64_t i : {50, 51}) p0.data<float>()[i] = 1.0f + static_cast<float>(2 * (i - 50) + 1) / 256.0f;
  Tensor g = test::random_tensor({n}, 72);
  for (int64_t i : {50, 51}) g.data<float>()[i] = 0.0f;
  const Tensor m0 = Tensor::zeros({n}), v0 = Tensor::zeros({n});
  const kernels::AdamWStep no_decay{1e-2, 0.9, 0.95, 1e-8, 0.0, 3, 1.0};
  const std::vector<kernels::AdamWRun> runs{{0, 30, true}, {33, 77, false}};
  test::for_each_cpu_target([&] {
    Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
    Tensor p_plain = p0.clone(), m_plain = m0.clone(), v_plain = v0.clone();
    Tensor copy = Tensor::full({n}, 3.0).to(DType::BF16);
    kernels::adamw_step(p, g, m, v, step, runs, copy);
    kernels::adamw_step(p_plain, g, m_plain, v_plain, step, runs);
    EXPECT_EQ(std::memcmp(p.raw_data(), p_plain.raw_data(), p.nbytes()), 0);
    EXPECT_EQ(std::memcmp(m.raw_data(), m_plain.raw_data(), m.nbytes()), 0);
    Tensor want = Tensor::empty({n}, DType::BF16);
    kernels::convert(p, want);
    const uint16_t* got = copy.bf16_data();
    for (int64_t i = 0; i < n; ++i) {
      const bool stepped = i < 30 || i >= 33;
      EXPECT_EQ(got[i], stepped ? want.bf16_data()[i] : f32_to_bf16(3.0f)) << "element " << i;
    }
    EXPECT_TRUE(std::isnan(bf16_to_f32(got[40])));
    // The two halfway values (no gradient, no decay: they stay as they were) round to even, one down
    // and one up.
    Tensor halfway = p0.narrow(50, 2).clone(), zero_m = Tensor::zeros({2}), zero_v = Tensor::zeros({2});
    Tensor halfway_copy = Tensor::empty({2}, DType::BF16);
    kernels::adamw_step(halfway, g.narrow(50, 2), zero_m, zero_v, no_decay, {}, halfway_copy);
    EXPECT_EQ(bf16_to_f32(halfway_copy.bf16_data()[0]), 1.0f);
    EXPECT_EQ(bf16_to_f32(halfway_copy.bf16_data()[1]), 1.0f + 4.0f / 256.0f);
  });
  Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
  Tensor wrong_shape = Tensor::empty({n - 1}, DType::BF16), wrong_dtype = Tensor::empty({n});
  EXPECT_THROW(kernels::adamw_step(p, g, m, v, step, runs, wrong_shape), Error);
  EXPECT_THROW(kernels::adamw_step(p, g, m, v, step, runs, wrong_dtype), Error);
}

TEST(AdamW, StateRoundTrips) {
  Rng rng(5);
  ThreeParameters model(rng);
  FlatParameters params(model.parameters());
  AdamW optimizer(params, AdamWSettings{});
  backward(model, true);
  optimizer.step(0.1);
  const auto state = optimizer.state();
  ASSERT_EQ(state.size(), 6u);

  Rng again(5);
  ThreeParameters other(again);
  FlatParameters other_params(other.parameters());
  AdamW restored(other_params, AdamWSettings{});
  restored.load_state(state, optimizer.steps_taken(), "test");
  const auto back = restored.state();
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(back[i].first, state[i].first);
    EXPECT_EQ(back[i].second.to_vector<double>(), state[i].second.to_vector<double>()) << state[i].first;
  }
  EXPECT_EQ(restored.steps_taken(), 1);
}

// ZeRO-style sharding: three optimisers that each own one shard of the same flat buffers together take
// exactly the step of one optimiser over all of it, their moments are their shards of its moments, and
// their squared gradient norms add up to its.
TEST(AdamW, ShardsTogetherTakeTheWholeStep) {
  Rng rng(9), same(9);
  ThreeParameters sharded(rng), whole(same);
  FlatParameters sharded_params(sharded.parameters(), 3), whole_params(whole.parameters(), 3);
  ASSERT_EQ(sharded_params.numel() % (3 * 16), 0);
  const AdamWSettings settings;
  std::vector<std::unique_ptr<AdamW>> shards;
  for (int s = 0; s < 3; ++s) shards.push_back(std::make_unique<AdamW>(sharded_params, settings, s, 3));
  AdamW reference(whole_params, settings);
  for (int64_t t = 1; t <= 3; ++t) {
    backward(sharded, t != 2);
    backward(whole, t != 2);
    double sum_squares = 0;
    for (const auto& shard : shards) sum_squares += shard->grad_sum_squares();
    const double norm = std::sqrt(reference.grad_sum_squares());
    EXPECT_NEAR(std::sqrt(sum_squares), norm, 1e-12);
    for (const auto& shard : shards) {
      shard->clip_to(norm, 1.0);
      shard->step(0.1);
    }
    reference.clip_to(norm, 1.0);
    reference.step(0.1);
    EXPECT_EQ(sharded_params.values().to_vector<double>(), whole_params.values().to_vector<double>()) << "step " << t;
    sharded_params.zero_grad();
    whole_params.zero_grad();
  }
  const Tensor whole_exp_avg = Tensor::zeros({whole_params.numel()}, DType::F64);
  for (size_t i = 0; i < whole_params.parameters().size(); ++i)
    whole_params.view(whole_exp_avg, i).copy_from(reference.state()[2 * i].second);
  for (int s = 0; s < 3; ++s) {
    const FlatParameters::Range owned = shards[static_cast<size_t>(s)]->owned();
    EXPECT_EQ(shards[static_cast<size_t>(s)]->shard_state()[0].second.to_vector<double>(),
              whole_exp_avg.narrow(owned.begin, owned.size()).to_vector<double>())
        << "shard " << s;
  }
}

}  // namespace
}  // namespace lt
