// Gradient checks: central finite differences in f64 against an op's backward.
//
// A case builds f64 inputs and a forward. The check draws a fixed random projection R of the output,
// back-propagates R, and compares every input's gradient with (f(x + h) - f(x - h)) / 2h of <out, R>,
// element by element. max_rel is the largest error divided by the largest gradient magnitude of that
// input, so near-zero gradients do not inflate it.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "tensor/random.h"

namespace lt {

struct GradCase {
  std::string op;       // one line of `lingtrain gradcheck` per op name
  std::string variant;  // what this case exercises (shapes, flags)
  // f64 inputs; those that require grad are checked (integer tensors are passed through the capture).
  std::function<std::vector<Variable>(Rng&)> make_inputs;
  std::function<Variable(const std::vector<Variable>&)> forward;
};

struct GradCheckResult {
  std::string op, variant;
  double max_abs = 0, max_rel = 0;
  int64_t checked = 0;  // elements compared
  bool pass = false;
};

struct GradCheckOptions {
  double step = 1e-5;
  double tolerance = 1e-6;          // on max_rel
  int64_t max_elements = 400;       // per input; larger inputs are sampled on an even stride
  uint64_t seed = 1;
};

GradCheckResult gradcheck(const GradCase& c, const GradCheckOptions& options = {});

// Convenience for cases: an f64 leaf that requires grad, Normal(0, std).
Variable grad_input(const Shape& shape, Rng& rng, double std = 1.0);
// A case whose inputs are all such leaves (std 1) with the given shapes.
GradCase simple(std::string op, std::string variant, std::vector<Shape> shapes,
                std::function<Variable(const std::vector<Variable>&)> forward);

// The cases for every op of autograd/ops.h (autograd/gradcheck_cases.cpp).
std::vector<GradCase> core_gradcheck_cases();

}  // namespace lt
