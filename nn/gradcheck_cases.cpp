// Gradient checks of the ops defined in nn/. NormHead's full-Jacobian normalisation is checked here;
// the detached variant is by design not the derivative of its forward (the Hugging Face training
// path treats the norm as a constant), so its head gradient is checked against g / ||W|| in
// tests/nn/test_normhead.cpp, and only the gradient of h is checked here.
#include "nn/gradcheck_cases.h"

#include "autograd/ops.h"
#include "nn/dpo_loss.h"
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

  // The per-sequence log-probabilities: B sequences of T positions, every 3rd target ignored, and in the
  // last case one sequence with every target ignored. B T = 300 spans two chunks of rows.
  struct SequenceCase {
    int64_t B, T, H, V;
    HeadNorm norm;
    bool one_sequence_ignored;
    std::string what;
  };
  const std::vector<SequenceCase> sequence_cases{{3, 5, 3, 23, HeadNorm::Full, false, "full Jacobian"},
                                                 {2, 150, 2, 7, HeadNorm::None, false, "plain head, two chunks"},
                                                 {3, 5, 3, 23, HeadNorm::Detached, false, "detached norm: dh only"},
                                                 {3, 4, 3, 11, HeadNorm::Full, true, "one sequence ignored"}};
  for (const SequenceCase& sc : sequence_cases) {
    std::vector<int32_t> ids(static_cast<size_t>(sc.B * sc.T));
    Rng target_rng(8);
    for (size_t n = 0; n < ids.size(); ++n) {
      const bool ignored = n % 3 == 0 || (sc.one_sequence_ignored && static_cast<int64_t>(n) / sc.T == 1);
      ids[n] = ignored ? -100 : static_cast<int32_t>(target_rng.below(sc.V));
    }
    const Tensor targets = Tensor::from_vector<int32_t>({sc.B * sc.T}, ids);
    const HeadNorm norm = sc.norm;
    cases.push_back({"normhead_token_logprobs",
                     sc.what + " B=" + std::to_string(sc.B) + " T=" + std::to_string(sc.T) + " H=" +
                         std::to_string(sc.H) + " V=" + std::to_string(sc.V),
                     [sc](Rng& rng) {
                       Variable head = grad_input({sc.V, sc.H}, rng);
                       head.set_requires_grad(sc.norm != HeadNorm::Detached);
                       return std::vector<Variable>{grad_input({sc.B * sc.T, sc.H}, rng), head};
                     },
                     [targets, norm](const std::vector<Variable>& x) {
                       return normhead_token_logprobs(x[0], x[1], targets, -100, norm);
                     }});
  }
  // DPO: 3 pairs over 30 tokens (prompt tokens -1), pair 1 format-recovery (only some of its response
  // tokens counted), pair 2's rejected response a single token; beta large enough that the sigmoid is
  // far from its linear part.
  struct DpoCase {
    double beta, rpo_alpha;
    std::string what;
  };
  std::vector<int32_t> response(30, -1), counted(30, 0);
  const std::vector<std::pair<int, int>> spans = {{2, 6}, {6, 9}, {11, 16}, {16, 21}, {23, 27}, {27, 28}};
  for (size_t j = 0; j < spans.size(); ++j)
    for (int n = spans[j].first; n < spans[j].second; ++n) {
      response[static_cast<size_t>(n)] = static_cast<int32_t>(j);
      counted[static_cast<size_t>(n)] = j / 2 == 1 ? n % 2 : 1;
    }
  const Tensor response_N = Tensor::from_vector<int32_t>({30}, response);
  const Tensor counted_N = Tensor::from_vector<int32_t>({30}, counted);
  const Tensor reference = Tensor::from_vector<double>({6}, {-4.1, -3.2, -6.0, -5.5, -3.0, -1.2});
  for (const DpoCase& dc : std::vector<DpoCase>{{0.1, 0.05, "beta 0.1, rpo 0.05 (Ling)"},
                                                {2.0, 0.0, "beta 2, no NLL term"},
                                                {0.5, 1.0, "beta 0.5, rpo 1"}}) {
    cases.push_back({"dpo_loss", dc.what + " N=30 P=3",
                     [](Rng& rng) { return std::vector<Variable>{grad_input({30}, rng)}; },
                     [=](const std::vector<Variable>& x) {
                       return dpo_loss(x[0], response_N, counted_N, reference, dc.beta, dc.rpo_alpha).loss;
                     }});
  }
  return cases;
}

}  // namespace lt
