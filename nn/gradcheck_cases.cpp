// Gradient checks of the ops defined in nn/. NormHead's full-Jacobian normalisation is checked here;
// the detached variant is by design not the derivative of its forward (the Hugging Face training
// path treats the norm as a constant), so its head gradient is checked against g / ||W|| in
// tests/nn/test_normhead.cpp, and only the gradient of h is checked here.
#include "nn/gradcheck_cases.h"

#include "autograd/ops.h"
#include "nn/normhead.h"

namespace lt {

std::vector<GradCase> nn_gradcheck_cases() {
  std::vector<GradCase> cases;
  for (Shape shape : {Shape{17, 3}, Shape{129, 1}, Shape{3, 17}})
    cases.push_back({"normhead", "full Jacobian " + shape_str(shape),
                     [shape](Rng& rng) { return std::vector<Variable>{grad_input(shape, rng)}; },
                     [](const std::vector<Variable>& x) { return column_normalize(x[0], /*detached=*/false); }});

  // The fused head and loss: h [N, H], head [V, H], targets with every 4th ignored. N = 300 spans two
  // chunks of rows (256 + 44); the last case ignores every target (loss 0, zero gradients).
  struct HeadCase {
    int64_t N, H, V;
    HeadNorm norm;
    int64_t ignore_every;
    std::string what;
  };
  for (const HeadCase& hc : std::vector<HeadCase>{{17, 3, 23, HeadNorm::Full, 4, "full Jacobian"},
                                                  {300, 3, 5, HeadNorm::Full, 4, "full Jacobian, two chunks"},
                                                  {17, 5, 129, HeadNorm::None, 4, "plain head"},
                                                  {300, 2, 7, HeadNorm::None, 4, "plain head, two chunks"},
                                                  {17, 3, 23, HeadNorm::Detached, 4, "detached norm: dh only"},
                                                  {5, 3, 7, HeadNorm::Full, 1, "every target ignored"}}) {
    std::vector<int32_t> ids(static_cast<size_t>(hc.N));
    Rng target_rng(7);
    for (size_t n = 0; n < ids.size(); ++n)
      ids[n] = n % hc.ignore_every == 0 ? -100 : static_cast<int32_t>(target_rng.below(hc.V));
    const Tensor targets = Tensor::from_vector<int32_t>({hc.N}, ids);
    const HeadNorm norm = hc.norm;
    cases.push_back({"normhead_cross_entropy",
                     hc.what + " N=" + std::to_string(hc.N) + " H=" + std::to_string(hc.H) + " V=" +
                         std::to_string(hc.V),
                     [hc](Rng& rng) {
                       Variable head = grad_input({hc.V, hc.H}, rng);
                       head.set_requires_grad(hc.norm != HeadNorm::Detached);
                       return std::vector<Variable>{grad_input({hc.N, hc.H}, rng), head};
                     },
                     [targets, norm](const std::vector<Variable>& x) {
                       return normhead_cross_entropy(x[0], x[1], targets, -100, norm);
                     }});
  }
  return cases;
}

}  // namespace lt
