// The Ling model with its routed experts split over the ranks (--expert-parallel) against one process
// holding every expert that takes each rank's batch as one micro-batch, bit for bit: the loss of every
// rank's batch, every replicated parameter's gradient of it, and a rank's experts' gradients accumulated
// over the micro-batches in rank order; in f32 and under mixed precision.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist/expert_exchange.h"
#include "model/config.h"
#include "model/hf_names.h"
#include "model/ling.h"
#include "tensor/kernels.h"
#include "tests/test_util.h"
#include "tensor/random.h"
#include "tests/mpi/mpi_world.h"

namespace lt {
namespace {

using mpi_test::world;

void check_against_one_process() {
  const int G = world->size(), r = world->rank();
  LingConfig config = preset_config("tiny");
  config.num_experts = 2 * G;
  const int64_t B = 2, T = 16;
  auto batch_of = [&](int s) {
    Rng rng(1000 + static_cast<uint64_t>(s));
    std::vector<int32_t> ids(static_cast<size_t>(B * (T + 1)));
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(config.vocab_size)));
    const Tensor all = Tensor::from_vector<int32_t>({B, T + 1}, ids);
    std::vector<int32_t> inputs, targets;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        inputs.push_back(ids[static_cast<size_t>(b * (T + 1) + t)]);
        targets.push_back(ids[static_cast<size_t>(b * (T + 1) + t + 1)]);
      }
    return std::pair{Tensor::from_vector<int32_t>({B, T}, inputs), Tensor::from_vector<int32_t>({B, T}, targets)};
  };

  LingForCausalLM whole(config, 7);
  double whole_loss = 0;
  std::vector<Tensor> replicated_grads;  // of rank r's batch alone
  for (int s = 0; s < G; ++s) {
    if (s == r) {
      // The replicated parameters' gradients of this batch alone: the ones before it set aside.
      for (const Parameter& p : whole.parameters())
        if (!is_stacked_experts(p.name) && p.value->grad().defined()) p.value->zero_grad();
    }
    const auto [inputs, targets] = batch_of(s);
    MoEContext context;
    context.training = true;
    const LossBreakdown loss = whole.loss(inputs, targets, context);
    loss.total.backward();
    if (s == r) {
      whole_loss = loss.total.value().item();
      for (const Parameter& p : whole.parameters())
        if (!is_stacked_experts(p.name)) replicated_grads.push_back(p.value->grad().clone());
    }
  }

  LingForCausalLM split(config, 7, ExpertSlice{r, G});
  ExpertCommunicatorGroup group(*world);
  split.set_expert_group(&group);
  const auto [inputs, targets] = batch_of(r);
  MoEContext context;
  context.training = true;
  const LossBreakdown loss = split.loss(inputs, targets, context);
  loss.total.backward();
  EXPECT_EQ(loss.total.value().item(), whole_loss);

  const std::vector<Parameter> whole_params = whole.parameters(), split_params = split.parameters();
  ASSERT_EQ(whole_params.size(), split_params.size());
  size_t replicated = 0;
  const int64_t L = config.num_experts / G;
  for (size_t i = 0; i < split_params.size(); ++i) {
    const std::string& name = split_params[i].name;
    const Tensor grad = split_params[i].value->grad();
    if (is_stacked_experts(name)) {
      EXPECT_EQ(grad.to_vector<float>(), whole_params[i].value->grad().narrow(r * L, L).to_vector<float>()) << name;
      EXPECT_EQ(split_params[i].value->value().to_vector<float>(),
                whole_params[i].value->value().narrow(r * L, L).to_vector<float>())
          << name << ": the initial values";
    } else {
      EXPECT_EQ(grad.to_vector<float>(), replicated_grads[replicated++].to_vector<float>()) << name;
    }
  }
}

TEST(ExpertParallelModel, HasTheBitsOfOneProcessWithMicroBatches) { check_against_one_process(); }

// Under mixed precision (where the CPU has the bf16 GEMM) the ranks send x's kept bf16 rows to the experts,
// which their GEMMs round to anyway: still the bits of one process.
TEST(ExpertParallelModel, InBf16HasTheBitsOfOneProcessWithMicroBatches) {
  if (!kernels::cpu_has_bf16_matmul()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  const test::MatmulPrecisionScope mixed(kernels::MatmulPrecision::BF16Inputs);
  check_against_one_process();
}

}  // namespace
}  // namespace lt
