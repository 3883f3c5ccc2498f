// Determinism: a fixed seed and thread count give bit-identical forward values and gradients, run
// after run. The model is a small decoder block that goes through every differentiable op of
// autograd/ops.h, so a kernel that reduced in a timing-dependent order would show up here.
#include <gtest/gtest.h>

#include <cstring>

#include "autograd/ops.h"
#include "tensor/kernels.h"
#include "tensor/threadpool.h"
#include "tests/test_util.h"

namespace lt {
namespace {

struct RunResult {
  std::vector<Tensor> outputs;  // forward values
  std::vector<Tensor> grads;    // parameter gradients, in parameter order
};

RunResult run_block(uint64_t seed, int64_t B = 2, int64_t T = 33) {
  const int64_t C = 64, Hq = 4, Hkv = 2, D = C / Hq, F = 96, E = 6, V = 97;
  Rng rng(seed);
  std::vector<Variable> params;
  auto param = [&](const Shape& shape, double std) {
    params.emplace_back(Tensor::randn(shape, rng, std), true);
    return params.back();
  };
  const Variable table = param({V, C}, 1.0);
  const Variable norm_w = param({C}, 1.0);
  const Variable w_qkv = param({C, (Hq + 2 * Hkv) * D}, 0.1);
  const Variable w_o = param({C, C}, 0.1);
  const Variable w_gate_up = param({C, 2 * F}, 0.1), w_down = param({F, C}, 0.1);
  const Variable w_router = param({C, E}, 0.1);
  const Variable expert_bias = param({E, C}, 0.1);
  const Variable w_head = param({C, V}, 0.1);

  // Token ids repeat (the embedding backward sums rows); one target is ignored.
  std::vector<int32_t> ids(static_cast<size_t>(B * T)), targets(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(rng.below(V / 3));
    targets[i] = static_cast<int32_t>(rng.below(V));
  }
  targets[5] = -100;
  const Tensor ids_BT = Tensor::from_vector<int32_t>({B, T}, ids);
  const Tensor targets_N = Tensor::from_vector<int32_t>({B * T}, targets);

  // Attention sub-block: x + Wo attention(rope(q), rope(k), v), q/k/v sliced from one fused projection.
  const Variable x_BTC = embedding(table, ids_BT);
  const Variable h_BTC = rmsnorm(x_BTC, norm_w, 1e-6);
  const Variable qkv_N = matmul(reshape(h_BTC, {B * T, C}), w_qkv);
  const Variable q = rope(reshape(slice_cols(qkv_N, 0, Hq * D), {B, T, Hq, D}), 10000.0);
  const Variable k = rope(reshape(slice_cols(qkv_N, Hq * D, Hkv * D), {B, T, Hkv, D}), 10000.0);
  const Variable v = reshape(slice_cols(qkv_N, (Hq + Hkv) * D, Hkv * D), {B, T, Hkv, D});
  const Variable att_BTC = reshape(attention(q, k, v), {B, T, C});
  const Variable x2_BTC = add(x_BTC, matmul(att_BTC, w_o));

  // Feed-forward: SwiGLU, plus a silu branch so both activations run.
  const Variable x2_NC = reshape(x2_BTC, {B * T, C});
  const Variable ffn_NC = matmul(swiglu(matmul(x2_NC, w_gate_up)), w_down);
  const Variable x3_NC = add(x2_NC, sub(ffn_NC, scale(silu(x2_NC), 0.1)));

  // Routing: softmax -> top-2 -> gathered log-probabilities; a per-expert term gathered by the chosen
  // experts (gather_rows) and summed back per expert (scatter_add_rows).
  const Variable logits_NE = matmul(x3_NC, w_router);
  const TopK top = topk(softmax(logits_NE), 2);
  const Variable chosen_logp_NK = gather_cols(log_softmax(logits_NE), top.indices);
  const Tensor first_expert_N = Tensor::empty({B * T}, DType::I32);
  {
    const int32_t* all = top.indices.data<int32_t>();
    int32_t* first = first_expert_N.data<int32_t>();
    for (int64_t n = 0; n < B * T; ++n) first[n] = all[n * 2];
  }
  const Variable expert_term_NC = gather_rows(expert_bias, first_expert_N);
  const Variable per_expert_EC = scatter_add_rows(mul(x3_NC, expert_term_NC), first_expert_N, E);

  // Loss: cross-entropy of the head, plus small auxiliary terms that reach every branch.
  const Variable ce = cross_entropy(matmul(x3_NC, w_head), targets_N);
  const Variable aux = add(scale(sum(top.values), 0.01), scale(mean(chosen_logp_NK), -0.01));
  const Variable loss = add(add(ce, aux), scale(sum(per_expert_EC), 1e-3));
  loss.backward();

  RunResult result;
  result.outputs = {loss.value(), x3_NC.value(), top.values.value(), top.indices, per_expert_EC.value()};
  for (const Variable& p : params) result.grads.push_back(p.grad());
  return result;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Determinism, ForwardAndBackwardAreBitIdenticalRunToRun) {
  const int original_threads = num_threads();
  set_num_threads(2);
  const RunResult first = run_block(1234);
  const RunResult second = run_block(1234);
  set_num_threads(original_threads);

  ASSERT_EQ(first.outputs.size(), second.outputs.size());
  for (size_t i = 0; i < first.outputs.size(); ++i)
    EXPECT_TRUE(same_bits(first.outputs[i], second.outputs[i])) << "output " << i << " " << first.outputs[i].str();
  ASSERT_EQ(first.grads.size(), second.grads.size());
  for (size_t i = 0; i < first.grads.size(); ++i) {
    ASSERT_TRUE(first.grads[i].defined()) << "parameter " << i << " received no gradient";
    EXPECT_TRUE(same_bits(first.grads[i], second.grads[i])) << "gradient of parameter " << i;
  }
  EXPECT_TRUE(std::isfinite(first.outputs[0].item()));

  // A different seed gives a different run: the comparison above is not vacuous.
  const RunResult other = run_block(4321);
  EXPECT_FALSE(same_bits(first.outputs[0], other.outputs[0]));
}

// Thread count must not change a single bit: chunk bounds and reduction order are fixed by the data,
// so a run resumed on a machine with a different core count continues the same trajectory.
TEST(Determinism, ResultsDoNotDependOnTheThreadCount) {
  const int original_threads = num_threads();
  // Enough rows (B*T = 640) that the row-parallel kernels and reductions split into several chunks.
  const int64_t B = 4, T = 160;
  set_num_threads(1);
  const RunResult one = run_block(1234, B, T);
  for (int threads : {2, 3, 5}) {
    set_num_threads(threads);
    const RunResult many = run_block(1234, B, T);
    for (size_t i = 0; i < one.outputs.size(); ++i)
      EXPECT_TRUE(same_bits(one.outputs[i], many.outputs[i])) << "output " << i << " with " << threads << " threads";
    for (size_t i = 0; i < one.grads.size(); ++i)
      EXPECT_TRUE(same_bits(one.grads[i], many.grads[i])) << "gradient of parameter " << i << " with " << threads
                                                          << " threads";
  }
  set_num_threads(original_threads);
}

// The whole-tensor reductions behind the loss and the gradient norm, on more elements than one
// reduction chunk holds.
TEST(Determinism, LargeReductionsDoNotDependOnTheThreadCount) {
  const int original_threads = num_threads();
  Rng rng(7);
  const Tensor x = Tensor::randn({3'000'017}, rng, 1.0);
  auto reduce = [&](int threads) {
    set_num_threads(threads);
    Tensor total = Tensor::empty({1}, DType::F32), squares = Tensor::empty({1}, DType::F32);
    kernels::sum(x, total);
    kernels::sum_squares(x, squares);
    return std::vector<Tensor>{total, squares};
  };
  const std::vector<Tensor> one = reduce(1);
  for (int threads : {2, 3, 5}) {
    const std::vector<Tensor> many = reduce(threads);
    EXPECT_TRUE(same_bits(one[0], many[0])) << "sum with " << threads << " threads";
    EXPECT_TRUE(same_bits(one[1], many[1])) << "sum of squares with " << threads << " threads";
  }
  set_num_threads(original_threads);
}

}  // namespace
}  // namespace lt
