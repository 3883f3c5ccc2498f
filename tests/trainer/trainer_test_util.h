// What the Trainer tests share: random token batches, a constant learning rate, the flat weights.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "tensor/allocator.h"
#include "tensor/kernels.h"
#include "tensor/random.h"
#include "trainer/trainer.h"

namespace lt::test {

inline TokenBatch random_batch(Rng& rng, int64_t B, int64_t T) {
  std::vector<int32_t> ids(B * T), targets(B * T);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(rng.below(250));
    targets[i] = static_cast<int32_t>(rng.below(250));
  }
  return {Tensor::from_vector<int32_t>({B, T}, ids), Tensor::from_vector<int32_t>({B, T}, targets)};
}

inline TrainerSettings constant_lr(double lr) {
  TrainerSettings s;
  s.schedule.kind = "constant";
  s.schedule.peak = lr;
  return s;
}

// The bytes the graph of one forward of `model` (on its device) holds for the backward, and the norm of
// the gradients that backward gives, with the matmuls in `precision`.
inline std::pair<double, double> graph_bytes_and_grad_norm(LingForCausalLM& model, Device device, const TokenBatch& batch,
                                                           kernels::MatmulPrecision precision) {
  const Tensor ids = batch.inputs.to(device), targets = batch.targets.to(device);
  kernels::set_matmul_precision(precision);
  for (const auto& p : model.parameters()) p.value->zero_grad();
  CachingAllocator& allocator = allocator_for(device);
  const uint64_t before = allocator.stats().bytes_in_use;
  MoEContext context;
  context.training = true;
  context.noise_seed = 9;
  const LossBreakdown loss = model.loss(ids, targets, context);
  const uint64_t held = allocator.stats().bytes_in_use - before;
  loss.total.backward();
  kernels::set_matmul_precision(kernels::MatmulPrecision::F32);
  double squares = 0;
  for (const auto& p : model.parameters())
    for (float g : p.value->grad().to(Device::cpu()).to_vector<float>()) squares += double(g) * g;
  return {static_cast<double>(held), std::sqrt(squares)};
}

// Mixed precision keeps the activations in bf16 (autograd/saved.h): what the graph of a forward of `model`
// (on `device`) holds for its backward takes at most `at_most` of the memory it takes in f32, and the
// gradients of its backward are within 3% of f32's.
inline void expect_bf16_graph_within(LingForCausalLM& model, Device device, double at_most) {
  Rng rng(6);
  const TokenBatch batch = random_batch(rng, 2, 64);
  const auto [f32_bytes, f32_norm] = graph_bytes_and_grad_norm(model, device, batch, kernels::MatmulPrecision::F32);
  const auto [bf16_bytes, bf16_norm] =
      graph_bytes_and_grad_norm(model, device, batch, kernels::MatmulPrecision::BF16Inputs);
  std::printf("graph after the forward: f32 %.0f bytes, bf16 %.0f bytes (%.3f)\n", f32_bytes, bf16_bytes,
              bf16_bytes / f32_bytes);
  EXPECT_LT(bf16_bytes, at_most * f32_bytes);
  EXPECT_NEAR(bf16_norm, f32_norm, 0.03 * f32_norm);
}

inline std::vector<float> values_of(Trainer& trainer) { return trainer.parameters().values().to_vector<float>(); }

}  // namespace lt::test
