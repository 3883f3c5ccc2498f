// The autograd engine: seeding, accumulation over uses and over backward calls, grad mode, detach,
// freeing the graph, and a gradient check that catches a wrong backward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "tensor/allocator.h"
#include "tensor/kernels.h"
#include "tests/test_util.h"

namespace lt {
namespace {

Variable leaf(const std::vector<double>& values, bool requires_grad = true) {
  return Variable(Tensor::from_vector<double>({static_cast<int64_t>(values.size())}, values), requires_grad);
}

std::vector<double> grad_of(const Variable& v) { return v.grad().to_vector<double>(); }

TEST(Engine, BackwardFromAScalar) {
  // L = sum(a * b + a): dL/da = b + 1, dL/db = a.
  const Variable a = leaf({1, 2, 3}), b = leaf({4, 5, 6});
  const Variable loss = sum(add(mul(a, b), a));
  EXPECT_EQ(loss.value().item(), 4 + 10 + 18 + 6);
  EXPECT_TRUE(loss.requires_grad());
  EXPECT_FALSE(loss.is_leaf());
  loss.backward();
  EXPECT_EQ(grad_of(a), (std::vector<double>{5, 6, 7}));
  EXPECT_EQ(grad_of(b), (std::vector<double>{1, 2, 3}));
}

// Each leaf is named once, when its gradient from this backward is complete: the gradient it holds then is
// its final one. A leaf used by two nodes waits for both; the one used last in the forward comes first.
TEST(Engine, NamesEachLeafOnceItsGradientIsComplete) {
  // L = sum((a * b) * c + a): a is used twice (its second use, the add, runs first in the backward).
  const Variable a = leaf({1, 2, 3}), b = leaf({4, 5, 6}), c = leaf({7, 8, 9});
  const Variable frozen = leaf({1, 1, 1}, /*requires_grad=*/false);
  const Variable loss = sum(add(mul(mul(mul(a, b), c), frozen), a));
  std::vector<std::pair<const VariableImpl*, std::vector<double>>> named;
  {
    const LeafGradientsReady listening([&](const VariableImpl& leaf) {
      named.push_back({&leaf, leaf.grad.to_vector<double>()});
    });
    loss.backward();
  }
  ASSERT_EQ(named.size(), 3u);
  EXPECT_EQ(named[0].first, c.impl());  // c's one use is the last product's
  for (const auto& [leaf, grad] : named) {
    const Variable* v = leaf == a.impl() ? &a : leaf == b.impl() ? &b : &c;
    EXPECT_EQ(grad, grad_of(*v)) << "a leaf was named before its gradient was complete";
  }
  EXPECT_EQ(grad_of(a), (std::vector<double>{29, 41, 55}));  // b c + 1
  // Without a listener nothing is named; a backward from a leaf names that leaf.
  named.clear();
  sum(a).backward();
  EXPECT_TRUE(named.empty());
  {
    const LeafGradientsReady listening([&](const VariableImpl& leaf) { named.push_back({&leaf, {}}); });
    b.backward(Tensor::from_vector<double>({3}, {1, 1, 1}));
  }
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, b.impl());
}

TEST(Engine, ExplicitSeedForNonScalars) {
  const Variable x = leaf({1, 2, 3});
  const Variable y = scale(x, 3.0);
  y.backward(Tensor::from_vector<double>({3}, {1, 10, 100}));
  EXPECT_EQ(grad_of(x), (std::vector<double>{3, 30, 300}));
}

TEST(Engine, NonScalarWithoutSeedThrows) {
  const Variable x = leaf({1, 2, 3});
  const Variable y = scale(x, 2.0);
  EXPECT_THROW(y.backward(), Error);
  EXPECT_THROW(y.backward(Tensor::zeros({2}, DType::F64)), Error);  // seed of the wrong shape
  const Variable constant = leaf({1}, false);
  EXPECT_THROW(sum(constant).backward(), Error);  // nothing requires grad
}

TEST(Engine, AccumulatesOverUsesOfOneVariable) {
  // x used twice by one op: d(sum(x * x))/dx = 2x, d(sum(x + x))/dx = 2.
  const Variable x = leaf({1, -2, 3});
  sum(mul(x, x)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{2, -4, 6}));

  const Variable y = leaf({1, -2, 3});
  sum(add(y, y)).backward();
  EXPECT_EQ(grad_of(y), (std::vector<double>{2, 2, 2}));

  // An intermediate used by two later ops sums both paths before flowing on:
  // h = 2z, L = sum(h * h) + sum(h) -> dL/dz = 2 * (2h + 1).
  const Variable z = leaf({1, 2});
  const Variable h = scale(z, 2.0);
  add(sum(mul(h, h)), sum(h)).backward();
  EXPECT_EQ(grad_of(z), (std::vector<double>{2 * (2 * 2 + 1), 2 * (2 * 4 + 1)}));
}

TEST(Engine, AccumulatesAcrossBackwardCallsOnLeaves) {
  // Micro-batches: two graphs over the same parameter add their gradients until zero_grad.
  const Variable w = leaf({1, 2});
  sum(scale(w, 3.0)).backward();
  sum(mul(w, w)).backward();
  EXPECT_EQ(grad_of(w), (std::vector<double>{3 + 2, 3 + 4}));
  w.value().data<double>()[0] = 100;  // the gradient is the leaf's own storage, not an alias of values
  EXPECT_EQ(grad_of(w), (std::vector<double>{5, 7}));
  Variable w_mut = w;
  w_mut.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  sum(w).backward();
  EXPECT_EQ(grad_of(w), (std::vector<double>{1, 1}));
}

TEST(Engine, LeafGradIsNotAnAliasOfAnotherGradient) {
  // add hands its incoming gradient to both inputs; the two leaves must still own separate storage.
  const Variable a = leaf({1, 2}), b = leaf({3, 4});
  sum(add(a, b)).backward();
  EXPECT_FALSE(a.grad().shares_storage(b.grad()));
  sum(scale(a, 10.0)).backward();
  EXPECT_EQ(grad_of(a), (std::vector<double>{11, 11}));
  EXPECT_EQ(grad_of(b), (std::vector<double>{1, 1}));
}

TEST(Engine, PendingGradientsThatAliasAreSummedApart) {
  // add hands one gradient tensor to both of its inputs, here two intermediate results u and v; each then
  // takes a second contribution, which must not reach the other through the storage they share (a sum in
  // place is only for a gradient that nothing else holds). Both orders of the loss's terms, so that either
  // contribution may arrive first.
  for (bool add_first : {true, false}) {
    const Variable x = leaf({1, 2}), y = leaf({3, 4});
    const Variable u = scale(x, 1.0), v = scale(y, 1.0);
    const Variable shared = sum(add(u, v)), own = add(sum(scale(u, 10.0)), sum(scale(v, 100.0)));
    (add_first ? add(shared, own) : add(own, shared)).backward();
    EXPECT_EQ(grad_of(x), (std::vector<double>{11, 11})) << add_first;
    EXPECT_EQ(grad_of(y), (std::vector<double>{101, 101})) << add_first;
  }
}

// x * factor, whose backward writes its gradient through grad_target and records what it was given.
struct ScaleIntoTargetNode : Node {
  double factor;
  std::vector<GradTarget>* seen;
  const char* name() const override { return "scale_into_target"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    GradTarget t = grad_target(0, g);
    seen->push_back(t);
    if (t.beta == 0)
      kernels::scale(g, factor, t.tensor);
    else
      kernels::axpy(factor, g, t.tensor);
    return {t.returned()};
  }
};

Variable scale_into_target(const Variable& x, double factor, std::vector<GradTarget>* seen) {
  Tensor out = Tensor::empty_like(x.value());
  kernels::scale(x.value(), factor, out);
  auto node = std::make_shared<ScaleIntoTargetNode>();
  node->factor = factor;
  node->seen = seen;
  return make_result(out, node, {x});
}

TEST(Engine, ABackwardAddsIntoThePendingGradientOfAnIntermediate) {
  // u has two uses; whichever backward runs second finds u's gradient begun by the other and, through
  // grad_target, adds to it (beta 1, nothing returned) rather than handing the engine a second tensor
  // to sum. Both orders of the loss's terms.
  int added_into = 0;
  for (bool probe_first : {true, false}) {
    std::vector<GradTarget> seen;
    const Variable x = leaf({1, 2});
    const Variable u = scale(x, 1.0);
    const Variable probed = sum(scale_into_target(u, 10.0, &seen)), plain = sum(scale(u, 100.0));
    (probe_first ? add(probed, plain) : add(plain, probed)).backward();
    EXPECT_EQ(grad_of(x), (std::vector<double>{110, 110})) << probe_first;
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen[0].in_place, seen[0].beta == 1) << probe_first;
    added_into += seen[0].in_place;
  }
  EXPECT_GE(added_into, 1) << "in neither order did the second use add into the first one's gradient";
}

TEST(Engine, APendingGradientThatAliasesIsNotAddedInto) {
  // add hands one gradient tensor to both u and v; a later use of u must not add into it in place, or v
  // would see the sum through the storage they share.
  for (bool add_first : {true, false}) {
    std::vector<GradTarget> seen;
    const Variable x = leaf({1, 2}), y = leaf({3, 4});
    const Variable u = scale(x, 1.0), v = scale(y, 1.0);
    const Variable shared = sum(add(u, v));
    const Variable own = add(sum(scale_into_target(u, 10.0, &seen)), sum(scale_into_target(v, 100.0, &seen)));
    (add_first ? add(shared, own) : add(own, shared)).backward();
    EXPECT_EQ(grad_of(x), (std::vector<double>{11, 11})) << add_first;
    EXPECT_EQ(grad_of(y), (std::vector<double>{101, 101})) << add_first;
  }
}

// x passed on unchanged, whose backward records whether its gradient may go to x's node as a GEMM operand.
struct FeedsGemmsProbeNode : Node {
  std::vector<bool>* seen;
  const char* name() const override { return "feeds_gemms_probe"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    seen->push_back(gradient_feeds_gemms_only(0));
    return {g};
  }
};

Variable feeds_gemms_probe(const Variable& x, std::vector<bool>* seen) {
  auto node = std::make_shared<FeedsGemmsProbeNode>();
  node->seen = seen;
  return make_result(x.value().clone(), node, {x});
}

TEST(Engine, AGradientFeedsGemmsOnlyWhereAMatmulIsItsOneDestination) {
  const Variable a(test::random_tensor({3, 4}, 1, DType::F64), true);
  const Variable b(test::random_tensor({4, 5}, 2, DType::F64), true);
  const Variable addend(test::random_tensor({3, 5}, 3, DType::F64), true);
  std::vector<bool> seen;
  sum(feeds_gemms_probe(matmul(a, b), &seen)).backward();                    // a matmul's one use
  sum(feeds_gemms_probe(reshape(matmul(a, b), {5, 3}), &seen)).backward();  // through a view of it
  const Variable product = matmul(a, b);
  add(sum(feeds_gemms_probe(product, &seen)), sum(product)).backward();  // summed with another use
  sum(feeds_gemms_probe(matmul_add(a, b, addend), &seen)).backward();  // the addend reads the gradient too
  sum(feeds_gemms_probe(scale(a, 2.0), &seen)).backward();             // not a matmul
  const Variable viewed = matmul(a, b);
  add(sum(feeds_gemms_probe(reshape(viewed, {5, 3}), &seen)), sum(viewed)).backward();  // a view, another use
  EXPECT_EQ(seen, (std::vector<bool>{true, true, false, false, false, false}));
}

TEST(Engine, AReshapeToItsOwnShapeIsTheVariableItself) {
  // No node in between: a consumer of the "reshaped" value (a Linear's 2-D input) reaches x's gradient
  // through grad_target directly.
  const Variable x(Tensor::from_vector<double>({2, 3}, {1, 2, 3, 4, 5, 6}), true);
  const Variable u = scale(x, 2.0);
  EXPECT_EQ(reshape(u, {2, 3}).impl(), u.impl());
  EXPECT_EQ(reshape(u, {-1, 3}).impl(), u.impl());
  EXPECT_NE(reshape(u, {3, 2}).impl(), u.impl());
  sum(mul(reshape(u, {-1, 3}), reshape(reshape(u, {3, 2}), {2, 3}))).backward();  // sum(u^2): 8 x
  EXPECT_EQ(grad_of(x), (std::vector<double>{8, 16, 24, 32, 40, 48}));
}

// call_before_backward's hook runs as the backward reaches its result, before the nodes that made its input
// (parameter sharding gathers a layer's weights there), and the gradient passes on unchanged.
TEST(Engine, CallBeforeBackwardRunsItsHookBeforeTheNodesThatMadeItsInput) {
  const Variable x(Tensor::from_vector<double>({3}, {1, 2, 3}), true);
  std::vector<std::string> order;
  const LeafGradientsReady ready([&](const VariableImpl&) { order.push_back("x ready"); });
  const Variable y = call_before_backward(scale(x, 2.0), [&] { order.push_back("hook"); });
  sum(mul(y, y)).backward();  // sum(4 x^2): 8 x
  EXPECT_EQ(order, (std::vector<std::string>{"hook", "x ready"}));
  EXPECT_EQ(grad_of(x), (std::vector<double>{8, 16, 24}));
}

TEST(Engine, NoGradGuardRecordsNothing) {
  const Variable x = leaf({1, 2, 3});
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(grad_enabled());
    const Variable y = sum(mul(x, x));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    EXPECT_EQ(y.value().item(), 14.0);
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the inner guard restores what it found
  }
  EXPECT_TRUE(grad_enabled());
  const Variable z = sum(x);
  EXPECT_TRUE(z.requires_grad());
  EXPECT_NE(z.grad_fn(), nullptr);
}

TEST(Engine, ResultsOfConstantsRecordNothing) {
  const Variable a = leaf({1, 2}, false), b = leaf({3, 4}, false);
  const Variable c = add(a, b);
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(c.grad_fn(), nullptr);
}

TEST(Engine, DetachCutsTheGraph) {
  // L = sum(x * detach(x)): only the first factor carries a gradient, dL/dx = x.
  const Variable x = leaf({2, -3});
  const Variable copy = scale(x, 1.0);
  const Variable d = copy.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_TRUE(d.value().shares_storage(copy.value()));  // the same value, without the history
  sum(mul(x, d)).backward();
  EXPECT_EQ(grad_of(x), (std::vector<double>{2, -3}));
  EXPECT_FALSE(d.grad().defined());
}

TEST(Engine, GraphIsFreedAfterBackward) {
  const Variable x = leaf({1, 2, 3});
  const Variable h1 = scale(x, 2.0);
  const Variable h2 = mul(h1, h1);
  const Variable loss = sum(h2);
  const std::weak_ptr<Node> h1_node = h1.grad_fn(), h2_node = h2.grad_fn(), loss_node = loss.grad_fn();
  ASSERT_FALSE(h1_node.expired());
  loss.backward();
  // The nodes (and the activations they saved) are gone even though the Variables are still alive.
  EXPECT_TRUE(h1_node.expired());
  EXPECT_TRUE(h2_node.expired());
  EXPECT_TRUE(loss_node.expired());
  EXPECT_EQ(h1.grad_fn(), nullptr);
  EXPECT_EQ(h2.grad_fn(), nullptr);
  EXPECT_EQ(grad_of(x), (std::vector<double>{8, 16, 24}));  // d sum((2x)^2) / dx = 8x
  EXPECT_FALSE(h1.grad().defined());  // intermediates keep no gradient
}

TEST(Engine, TheGraphHoldsOnlyWhatBackwardsSave) {
  // scale saves nothing and sum only a shape, so h's value must go when its last Variable does.
  const Variable x(Tensor::full({1 << 20}, 1.0, DType::F64), true);
  CachingAllocator& allocator = allocator_for(Device::cpu());
  const uint64_t before = allocator.stats().bytes_in_use;
  Variable loss;
  {
    const Variable h = scale(x, 2.0);
    loss = sum(h);
  }
  EXPECT_LT(allocator.stats().bytes_in_use - before, uint64_t{1} << 20) << "h (8 MiB) is still alive";
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<double>()[7], 2.0);
}

// The reference gradients of a few ops whose backward can write into a leaf's gradient buffer.
struct BufferedGrads {
  std::vector<double> w, norm_weight, table;
};

BufferedGrads buffered_step(bool with_buffers, int backward_calls) {
  Rng rng(8);
  const Variable x(Tensor::randn({5, 3}, rng, 1.0, DType::F64), true);
  Variable w(Tensor::randn({4, 3}, rng, 1.0, DType::F64), true);
  Variable norm_weight(Tensor::randn({4}, rng, 1.0, DType::F64), true);
  Variable table(Tensor::randn({6, 4}, rng, 1.0, DType::F64), true);
  if (with_buffers) {  // stale contents that must never leak into a gradient
    for (Variable* v : {&w, &norm_weight, &table}) v->set_grad_buffer(Tensor::full(v->shape(), NAN, DType::F64));
  }
  const Tensor ids = Tensor::from_vector<int32_t>({5}, {1, 4, 1, 0, 5});
  for (int call = 0; call < backward_calls; ++call) {
    // w used twice (matmul of x, and w w^T), then rmsnorm and an embedding added in.
    const Variable h = add(rmsnorm(matmul(x, w, false, true), norm_weight, 1e-6), embedding(table, ids));
    add(sum(mul(h, h)), sum(matmul(w, w, false, true))).backward();
  }
  if (with_buffers) {
    for (const Variable* v : {&w, &norm_weight, &table}) EXPECT_TRUE(v->grad().shares_storage(v->impl()->grad_buffer));
  }
  return {w.grad().to_vector<double>(), norm_weight.grad().to_vector<double>(), table.grad().to_vector<double>()};
}

TEST(Engine, LeafGradientBuffersReceiveTheSameGradients) {
  for (int calls : {1, 2}) {
    SCOPED_TRACE(calls);
    const BufferedGrads plain = buffered_step(false, calls), buffered = buffered_step(true, calls);
    test::expect_close(buffered.w, plain.w, 1e-14, 0, "w");
    test::expect_close(buffered.norm_weight, plain.norm_weight, 1e-14, 0, "norm weight");
    test::expect_close(buffered.table, plain.table, 1e-14, 0, "embedding table");
  }
}

TEST(Engine, ZeroGradKeepsTheBufferAndTheNextGradientOverwritesIt) {
  Variable w = leaf({1, 2});
  const Tensor buffer = Tensor::full({2}, NAN, DType::F64);
  w.set_grad_buffer(buffer);
  sum(scale(w, 3.0)).backward();
  EXPECT_EQ(grad_of(w), (std::vector<double>{3, 3}));
  EXPECT_TRUE(w.grad().shares_storage(buffer));
  w.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  sum(mul(w, w)).backward();
  EXPECT_EQ(grad_of(w), (std::vector<double>{2, 4}));
  EXPECT_TRUE(w.grad().shares_storage(buffer));
}

// y = x with a backward that doubles the gradient: a deliberately wrong op for the checker to catch.
struct WrongIdentityNode : Node {
  const char* name() const override { return "wrong_identity"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor doubled = Tensor::empty_like(g);
    const double* src = g.data<double>();
    double* dst = doubled.data<double>();
    for (int64_t i = 0; i < g.numel(); ++i) dst[i] = 2.0 * src[i];
    return {doubled};
  }
};

Variable wrong_identity(const Variable& x) {
  return make_result(x.value().clone(), std::make_shared<WrongIdentityNode>(), {x});
}

TEST(Engine, GradcheckDetectsAWrongBackward) {
  const GradCase wrong{"wrong_identity", "[17]",
                       [](Rng& rng) { return std::vector<Variable>{grad_input({17}, rng)}; },
                       [](const std::vector<Variable>& x) { return wrong_identity(x[0]); }};
  const GradCheckResult result = gradcheck(wrong);
  EXPECT_FALSE(result.pass);
  EXPECT_GT(result.checked, 0);
  EXPECT_NEAR(result.max_rel, 0.5, 1e-6);  // analytic 2g against numeric g: error g, relative to 2g

  // The same case with a correct op passes, so the failure above is the backward's fault.
  const GradCase right{"scale", "[17] * 1",
                       [](Rng& rng) { return std::vector<Variable>{grad_input({17}, rng)}; },
                       [](const std::vector<Variable>& x) { return scale(x[0], 1.0); }};
  EXPECT_TRUE(gradcheck(right).pass);
}

// add_rmsnorm is add then rmsnorm in one forward pass: the same values, and the same gradients bit for bit
// where the sum has another use beside its norm (the residual stream) and where it has none.
TEST(Engine, AddRmsNormGivesTheValuesAndGradientsOfAddThenRmsNorm) {
  for (const bool sum_used : {true, false}) {
    SCOPED_TRACE(sum_used ? "sum used again" : "the norm alone");
    auto run = [&](bool fused) {
      const Variable a(test::random_tensor({6, 33}, 1), true), b(test::random_tensor({6, 33}, 2), true);
      const Variable w(test::random_tensor({33}, 3), true), c(test::random_tensor({6, 33}, 4));
      // a and b are intermediate results, as the residual stream and an MoE block's output are.
      const Variable a2 = mul(a, c), b2 = mul(b, c);
      Variable sum_v, normed;
      if (fused) {
        const AddRmsNorm r = add_rmsnorm(a2, b2, w, 1e-6);
        sum_v = r.sum;
        normed = r.normed;
      } else {
        sum_v = add(a2, b2);
        normed = rmsnorm(sum_v, w, 1e-6);
      }
      const Variable loss = sum_used ? add(sum(mul(normed, normed)), sum(mul(sum_v, c))) : sum(mul(normed, normed));
      loss.backward();
      std::vector<std::vector<float>> out;
      for (const Tensor& t : {sum_v.value(), normed.value(), loss.value(), a.grad(), b.grad(), w.grad()})
        out.push_back(t.to_vector<float>());
      return out;
    };
    EXPECT_EQ(run(true), run(false));
  }
}

}  // namespace
}  // namespace lt
