// EDiT's synchronisation arithmetic against numbers worked out by hand: the softmax weights of the
// pseudo-gradients, the clip factor, and two steps of the outer SGD with Nesterov momentum; plain
// averaging (lr 1, no momentum) lands the anchor on the workers' mean.
#include <gtest/gtest.h>

#include <cmath>

#include "dist/edit_math.h"

namespace lt {
namespace {

TEST(PseudoGradientWeights, SoftmaxOfNegativeNorms) {
  const double e = std::exp(-1.0);
  std::vector<double> w = pseudo_gradient_weights({1, 2}, {false, false}, 1.0);
  EXPECT_NEAR(w[0], 1 / (1 + e), 1e-15);
  EXPECT_NEAR(w[1], e / (1 + e), 1e-15);
  w = pseudo_gradient_weights({1000, 1002}, {false, false}, 2.0);  // no overflow; T scales the gaps
  EXPECT_NEAR(w[0], 1 / (1 + e), 1e-15);
  w = pseudo_gradient_weights({1, 2, 3}, {false, true, false}, 1.0);
  EXPECT_EQ(w[1], 0.0);
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(-2.0)), 1e-15);
  EXPECT_EQ(pseudo_gradient_weights({1, 2}, {true, true}, 1.0), (std::vector<double>{0, 0}));
  EXPECT_THROW(pseudo_gradient_weights({1}, {false}, 0.0), Error);
}

TEST(ClipFactor, ClipsOnlyAboveTheLimit) {
  EXPECT_DOUBLE_EQ(clip_factor(10, 5), 5 / (10 + 1e-6));
  EXPECT_EQ(clip_factor(3, 5), 1.0);
  EXPECT_EQ(clip_factor(1e9, 0), 1.0);
}

TEST(OuterSgd, TwoNesterovStepsByHand) {
  OuterSgd sgd;  // lr 0.7, momentum 0.8, Nesterov
  Tensor anchor = Tensor::full({2}, 1.0, DType::F64), buffer = Tensor::zeros({2}, DType::F64);
  sgd.step(anchor, Tensor::full({2}, 0.5, DType::F64), buffer, true);
  // buf = 0.5; step = 0.5 + 0.8 * 0.5 = 0.9; anchor = 1 - 0.7 * 0.9 = 0.37
  EXPECT_NEAR(anchor.to_vector<double>()[0], 0.37, 1e-15);
  sgd.step(anchor, Tensor::full({2}, 0.25, DType::F64), buffer, false);
  // buf = 0.8 * 0.5 + 0.25 = 0.65; step = 0.25 + 0.8 * 0.65 = 0.77; anchor = 0.37 - 0.7 * 0.77 = -0.169
  EXPECT_NEAR(buffer.to_vector<double>()[1], 0.65, 1e-15);
  EXPECT_NEAR(anchor.to_vector<double>()[1], -0.169, 1e-15);
}

TEST(OuterSgd, PlainAveragingLandsOnTheMean) {
  // Two workers moved the anchor 1 to 3 and to 5: the mean pseudo-gradient is 1 - 4 = -3.
  OuterSgd plain{1.0, 0.0, false};
  Tensor anchor = Tensor::full({3}, 1.0, DType::F64), buffer = Tensor::zeros({3}, DType::F64);
  plain.step(anchor, Tensor::full({3}, -3.0, DType::F64), buffer, true);
  EXPECT_EQ(anchor.to_vector<double>(), std::vector<double>(3, 4.0));
}

}  // namespace
}  // namespace lt
