// The gradient-check table: one entry per op and variant. Adding an op's check is adding a line here.
// Shapes include 1, 3, 17 and 129 so that SIMD tails (and single-lane vectors) are exercised.
#include "autograd/gradcheck.h"
#include "autograd/ops.h"

namespace lt {
namespace {

using Inputs = std::vector<Variable>;

// A case whose inputs are all f64 leaves drawn from Normal(0, 1) with the given shapes.
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

}  // namespace

std::vector<GradCase> core_gradcheck_cases() {
  std::vector<GradCase> cases;
  auto add_case = [&](GradCase c) { cases.push_back(std::move(c)); };

  // ---- elementwise
  add_case(simple("add", "same shape [17, 3]", {{17, 3}, {17, 3}}, [](const Inputs& x) { return add(x[0], x[1]); }));
  add_case(simple("add", "broadcast [3, 17, 129] + [129]", {{3, 17, 129}, {129}},
                  [](const Inputs& x) { return add(x[0], x[1]); }));
  add_case(simple("sub", "broadcast [17, 129] - [17, 129]", {{17, 129}, {17, 129}},
                  [](const Inputs& x) { return sub(x[0], x[1]); }));
  add_case(simple("sub", "broadcast [3, 17] - [17]", {{3, 17}, {17}}, [](const Inputs& x) { return sub(x[0], x[1]); }));
  add_case(simple("mul", "same shape [129]", {{129}, {129}}, [](const Inputs& x) { return mul(x[0], x[1]); }));
  add_case(simple("mul", "broadcast [3, 1, 17] * [1, 17]", {{3, 1, 17}, {1, 17}},
                  [](const Inputs& x) { return mul(x[0], x[1]); }));
  add_case(simple("scale", "[17, 3] * -0.7", {{17, 3}}, [](const Inputs& x) { return scale(x[0], -0.7); }));

  // ---- shape and reductions
  add_case(simple("reshape", "[3, 17] -> [17, 3]", {{3, 17}}, [](const Inputs& x) { return reshape(x[0], {17, 3}); }));
  add_case(simple("sum", "[3, 129]", {{3, 129}}, [](const Inputs& x) { return sum(x[0]); }));
  add_case(simple("mean", "[17, 3]", {{17, 3}}, [](const Inputs& x) { return mean(x[0]); }));

  // ---- matmul
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::string flags = std::string(ta ? "T" : "N") + (tb ? "T" : "N");
      const int64_t M = 17, K = 3, N = 129;
      add_case(simple("matmul", flags + " [17x3]@[3x129]", {ta ? Shape{K, M} : Shape{M, K}, tb ? Shape{N, K} : Shape{K, N}},
                      [ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }));
      add_case(simple("matmul", flags + " batched 3x[1x17]@[17x3]", {ta ? Shape{3, 17, 1} : Shape{3, 1, 17},
                                                                      tb ? Shape{3, 3, 17} : Shape{3, 17, 3}},
                      [ta, tb](const Inputs& x) { return matmul(x[0], x[1], ta, tb); }));
    }
  add_case(simple("matmul", "shared b [3,17,3]@[3,129]", {{3, 17, 3}, {3, 129}},
                  [](const Inputs& x) { return matmul(x[0], x[1]); }));
  add_case(simple("matmul", "shared b^T [3,17,3]@[129,3]^T", {{3, 17, 3}, {129, 3}},
                  [](const Inputs& x) { return matmul(x[0], x[1], false, true); }));

  // ---- activations

  // ---- normalisation

  // ---- softmax and losses

  // ---- rope

  // ---- attention

  // ---- indexing

  return cases;
}

}  // namespace lt
