// The fused DPO loss against an independent PyTorch implementation of TRL's arithmetic (the sigmoid loss
// and the rpo_alpha NLL term), written by
//   /usr/bin/python3 tests/reference/ling_reference.py dpo --out tests/golden/dpo
// on 4 packed pairs, one of them format-recovery (only some response tokens counted): the loss, its
// gradient with respect to every token's log-probability, and TRL's metrics from the op's sums.
#include <gtest/gtest.h>

#include <string>

#include "io/input_file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "nn/dpo_loss.h"
#include "tests/test_util.h"

namespace lt {
namespace {

struct DpoGolden {
  SafetensorsFile tensors;
  Json cases;
};

const DpoGolden& golden() {
  static const DpoGolden g = [] {
    const std::string dir = std::string(LINGTRAIN_SOURCE_DIR) + "/tests/golden/dpo/";
    return DpoGolden{load_safetensors(dir + "dpo.safetensors"),
                     parse_json(read_file(dir + "dpo.json"), dir + "dpo.json").at("cases")};
  }();
  return g;
}

TEST(DpoLoss, MatchesThePyTorchReference) {
  const DpoGolden& g = golden();
  ASSERT_EQ(g.cases.size(), 3u);
  for (size_t k = 0; k < g.cases.size(); ++k) {
    const Json& c = g.cases[k];
    SCOPED_TRACE(c.dump());
    const Variable x(g.tensors.get("token_logp").clone(), true);
    const DpoLoss out = dpo_loss(x, g.tensors.get("response"), g.tensors.get("counted"),
                                 g.tensors.get("reference_logp"), c.at("beta").get<double>(),
                                 c.at("rpo_alpha").get<double>());
    EXPECT_NEAR(out.loss.value().item(), c.at("loss").get<double>(), 1e-12);
    out.loss.backward();
    test::expect_close(x.grad().to_vector<double>(),
                       g.tensors.get("case" + std::to_string(k) + ".grad").to_vector<double>(), 1e-12, 1e-14, "grad");

    const std::vector<double> s = out.stats.to_vector<double>();
    const double pairs = s[kernels::kDpoPairs];
    ASSERT_EQ(pairs, 4);
    const Json& m = c.at("metrics");
    EXPECT_NEAR(s[kernels::kDpoRewardChosen] / pairs, m.at("rewards/chosen").get<double>(), 1e-12);
    EXPECT_NEAR(s[kernels::kDpoRewardRejected] / pairs, m.at("rewards/rejected").get<double>(), 1e-12);
    EXPECT_NEAR(s[kernels::kDpoCorrect] / pairs, m.at("rewards/accuracies").get<double>(), 1e-12);
    EXPECT_NEAR(s[kernels::kDpoMargin] / pairs, m.at("rewards/margins").get<double>(), 1e-12);
    EXPECT_NEAR(s[kernels::kDpoLogpChosen] / pairs, m.at("logps/chosen").get<double>(), 1e-12);
    EXPECT_NEAR(s[kernels::kDpoLogpRejected] / pairs, m.at("logps/rejected").get<double>(), 1e-12);
    EXPECT_NEAR(s[kernels::kDpoNllSum] / s[kernels::kDpoNllTokens], m.at("nll_loss").get<double>(), 1e-12);
  }
}

// At the reference the rewards are 0 and the loss is log 2 per pair, whatever beta; in f32 too.
TEST(DpoLoss, IsLogTwoAtTheReference) {
  const Tensor response = Tensor::from_vector<int32_t>({6}, {-1, 0, 0, 1, 1, -1});
  const Tensor counted = Tensor::from_vector<int32_t>({6}, {0, 1, 1, 1, 1, 0});
  const Tensor logp = Tensor::from_vector<float>({6}, {-9.f, -1.5f, -2.f, -0.5f, -4.f, -7.f});
  const Tensor reference = Tensor::from_vector<double>({2}, {-3.5, -4.5});
  for (double beta : {0.1, 3.0}) {
    const DpoLoss out = dpo_loss(Variable(logp), response, counted, reference, beta, 0.0);
    EXPECT_NEAR(out.loss.value().item(), std::log(2.0), 1e-7);
    EXPECT_EQ(out.stats.to_vector<double>()[kernels::kDpoMargin], 0.0);
  }
}

TEST(DpoLoss, RejectsAResponseIdOutsideThePairs) {
  const Tensor response = Tensor::from_vector<int32_t>({3}, {0, 1, 2});
  const Tensor counted = Tensor::from_vector<int32_t>({3}, {1, 1, 1});
  const Tensor reference = Tensor::from_vector<double>({2}, {0, 0});
  EXPECT_THROW(dpo_loss(Variable(Tensor::zeros({3}, DType::F64)), response, counted, reference, 0.1, 0), Error);
  EXPECT_THROW(dpo_loss(Variable(Tensor::zeros({3}, DType::F64)), response.narrow(0, 2), counted.narrow(0, 2),
                        reference, 0.0, 0),
               Error);
}

}  // namespace
}  // namespace lt
