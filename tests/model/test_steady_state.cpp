// Steady-state training steps take no memory from the system: once two steps have warmed the caching
// allocator up (every size the step needs has a cached block), further steps of the same shapes call
// the system allocator zero times, and the C heap (std::vector and friends, node bookkeeping) neither
// grows nor maps new memory either.
#include <gtest/gtest.h>

#include <malloc.h>

#include "model/ling.h"
#include "tensor/allocator.h"
#include "trainer/trainer.h"

namespace lt {
namespace {

struct HeapFootprint {
  size_t arena = 0, mapped = 0;  // bytes glibc holds from brk and from mmap
  bool operator==(const HeapFootprint&) const = default;
};

HeapFootprint heap_footprint() {
  const struct mallinfo2 info = mallinfo2();
  return {info.arena, info.hblkhd};
}

TEST(SteadyState, TrainingStepsAllocateNothingFromTheSystem) {
  LingConfig config = preset_config("tiny");  // MoE layers with a shared expert, NormHead
  LingForCausalLM model(config, 1);
  TrainerSettings settings;
  settings.routing_warmup_steps = 100;  // the routing warmup draws its noise every step
  settings.schedule.kind = "constant";
  settings.schedule.peak = 1e-3;
  Trainer trainer(model, settings);
  const int64_t B = 2, T = 32;
  Rng rng(2);
  std::vector<int32_t> ids(B * T), targets(B * T);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(rng.below(config.vocab_size));
    targets[i] = i % 7 == 0 ? -100 : static_cast<int32_t>(rng.below(config.vocab_size));
  }
  // Two micro-batches, so accumulation is part of the steady state too; the second reads the first's
  // targets as inputs (an ignored target becoming id 0).
  std::vector<int32_t> shifted(targets);
  for (int32_t& id : shifted) id = id < 0 ? 0 : id;
  const std::vector<TokenBatch> batch = {
      {Tensor::from_vector<int32_t>({B, T}, ids), Tensor::from_vector<int32_t>({B, T}, targets)},
      {Tensor::from_vector<int32_t>({B, T}, shifted), Tensor::from_vector<int32_t>({B, T}, ids)}};
  auto step = [&](int64_t) { trainer.step(batch); };
  for (int64_t i = 0; i < 2; ++i) step(i);

  CachingAllocator& allocator = allocator_for(Device::cpu());
  const uint64_t system_allocs = allocator.stats().system_allocs;
  const HeapFootprint heap = heap_footprint();
  for (int64_t i = 2; i < 5; ++i) step(i);
  EXPECT_EQ(allocator.stats().system_allocs, system_allocs) << "steady-state steps reached the system allocator";
  EXPECT_EQ(heap_footprint(), heap) << "the C heap grew or mapped memory during steady-state steps";
}

}  // namespace
}  // namespace lt
