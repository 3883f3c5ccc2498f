#include "dist/edit_math.h"

#include <algorithm>
#include <cmath>

#include "tensor/kernels.h"

namespace lt {

std::vector<double> pseudo_gradient_weights(const std::vector<double>& norms, const std::vector<bool>& dropped,
                                            double temperature) {
  LT_CHECK(norms.size() == dropped.size(), "pseudo_gradient_weights: ", norms.size(), " norms and ", dropped.size(),
           " dropped flags");
  LT_CHECK(temperature > 0, "pseudo_gradient_weights: the temperature must be > 0, got ", temperature);
  std::vector<double> weights(norms.size(), 0.0);
  double smallest = 0;
  bool any = false;
  for (size_t m = 0; m < norms.size(); ++m)
    if (!dropped[m]) {
      smallest = any ? std::min(smallest, norms[m]) : norms[m];
      any = true;
    }
  if (!any) return weights;
  double total = 0;
  for (size_t m = 0; m < norms.size(); ++m)
    if (!dropped[m]) total += weights[m] = std::exp(-(norms[m] - smallest) / temperature);
  for (double& w : weights) w /= total;
  return weights;
}

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

void OuterSgd::step(Tensor& anchor, const Tensor& grad, Tensor& momentum_buffer, bool first) const {
  LT_CHECK(anchor.shape() == grad.shape() && anchor.shape() == momentum_buffer.shape(), "outer SGD: anchor ",
           anchor.str(), ", pseudo-gradient ", grad.str(), " and momentum ", momentum_buffer.str(), " differ");
  if (momentum == 0) {
    kernels::axpy(-lr, grad, anchor);
    return;
  }
  if (first) momentum_buffer.copy_from(grad);
  else {
    kernels::scale(momentum_buffer, momentum, momentum_buffer);
    kernels::axpy(1.0, grad, momentum_buffer);
  }
  if (nesterov) {
    // As PyTorch forms it: the step g + momentum buf first, then one scaled update.
    Tensor update = grad.clone();
    kernels::axpy(momentum, momentum_buffer, update);
    kernels::axpy(-lr, update, anchor);
  } else {
    kernels::axpy(-lr, momentum_buffer, anchor);
  }
}

}  // namespace lt
