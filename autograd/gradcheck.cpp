#include "autograd/gradcheck.h"

#include <algorithm>
#include <cmath>

namespace lt {

Variable grad_input(const Shape& shape, Rng& rng, double std) {
  return Variable(Tensor::randn(shape, rng, std, DType::F64), true);
}

GradCase simple(std::string op, std::string variant, std::vector<Shape> shapes,
                std::function<Variable(const std::vector<Variable>&)> forward) {
  return {std::move(op), std::move(variant),
          [shapes](Rng& rng) {
            std::vector<Variable> inputs;
            for (const Shape& s : shapes) inputs.push_back(grad_input(s, rng));
            return inputs;
          },
          std::move(forward)};
}

namespace {
double project(const Tensor& out, const Tensor& r) {
  const double* o = out.data<double>();
  const double* w = r.data<double>();
  double total = 0;
  for (int64_t i = 0; i < out.numel(); ++i) total += o[i] * w[i];
  return total;
}
}  // namespace

GradCheckResult gradcheck(const GradCase& c, const GradCheckOptions& options) {
  GradCheckResult result{c.op, c.variant};
  Rng rng(options.seed);
  std::vector<Variable> inputs = c.make_inputs(rng);
  for (const Variable& in : inputs)
    LT_CHECK(!in.requires_grad() || in.value().dtype() == DType::F64, "gradcheck ", c.op, ": inputs must be f64");

  const Variable out = c.forward(inputs);
  LT_CHECK(out.value().dtype() == DType::F64, "gradcheck ", c.op, ": output must be f64");
  const Tensor projection = Tensor::randn(out.shape(), rng, 1.0, DType::F64);
  out.backward(projection);

  NoGradGuard no_grad;
  result.pass = true;
  for (Variable& in : inputs) {
    if (!in.requires_grad()) continue;
    Tensor analytic = in.grad().defined() ? in.grad() : Tensor::zeros_like(in.value());
    const double* a = analytic.data<double>();
    double* x = in.value().data<double>();
    const int64_t n = in.value().numel();
    const int64_t stride = std::max<int64_t>(1, (n + options.max_elements - 1) / options.max_elements);
    double max_abs = 0, max_grad = 0;
    for (int64_t i = 0; i < n; ++i) max_grad = std::max(max_grad, std::fabs(a[i]));
    for (int64_t i = 0; i < n; i += stride) {
      const double saved = x[i];
      x[i] = saved + options.step;
      const double plus = project(c.forward(inputs).value(), projection);
      x[i] = saved - options.step;
      const double minus = project(c.forward(inputs).value(), projection);
      x[i] = saved;
      const double numeric = (plus - minus) / (2 * options.step);
      max_grad = std::max(max_grad, std::fabs(numeric));
      max_abs = std::max(max_abs, std::fabs(numeric - a[i]));
      ++result.checked;
    }
    const double rel = max_abs / std::max(max_grad, 1e-12);
    result.max_abs = std::max(result.max_abs, max_abs);
    result.max_rel = std::max(result.max_rel, rel);
    if (!(rel <= options.tolerance)) result.pass = false;  // also catches NaN
  }
  return result;
}

}  // namespace lt
