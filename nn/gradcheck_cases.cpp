// Gradient checks of the ops defined in nn/. NormHead's full-Jacobian normalisation is checked here;
// the detached variant is by design not the derivative of its forward (the Hugging Face training
// path treats the norm as a constant), so tests/nn checks it against g / ||W|| directly.
#include "nn/gradcheck_cases.h"

#include "nn/layers.h"

namespace lt {

std::vector<GradCase> nn_gradcheck_cases() {
  std::vector<GradCase> cases;
  for (Shape shape : {Shape{17, 3}, Shape{129, 1}, Shape{3, 17}})
    cases.push_back({"normhead", "full Jacobian " + shape_str(shape),
                     [shape](Rng& rng) { return std::vector<Variable>{grad_input(shape, rng)}; },
                     [](const std::vector<Variable>& x) { return column_normalize(x[0], /*detached=*/false); }});
  return cases;
}

}  // namespace lt
