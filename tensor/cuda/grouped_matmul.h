// The definitions of lt::cuda::grouped_matmuls and grouped_weight_grads: one grouped GEMM
// (cuda::grouped_gemm, a single cuBLAS call) per product, or per pair of products that neither reads nor
// writes what the other writes, whose problems are the experts with rows, in expert order.
// Included by exactly one file of a program: tensor/cuda/gemm.cu, or tests/cuda/emulated_gpu.cpp where
// that stands in for the backend (after tensor/cuda/emulation.h, which then runs the kernel below).
//
// The problems' sizes come from the host copy of the offsets, since cuBLAS takes them on the host. Their
// addresses are written on the device, by a kernel reading the offsets there: the call needs no copy to
// the device and so no wait. An expert without rows is no problem of the call; its weight gradient,
// when written (beta 0), is zeroed instead, all such experts' in one launch.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/cuda/grid.h"
#include "tensor/cuda/kernels.h"
#include "tensor/grouped_gemm.h"

namespace lt::cuda {
namespace {

// The products one grouped call takes together (two independent products over the same segments).
constexpr int64_t kMaxParts = 2;

// How an operand steps, in elements: per expert (a stacked weight) and per row (a segment's rows).
struct Steps {
  int64_t expert, row;
};

// Where expert e's matrix of an operand starts, its segment beginning at row `first`:
// base + e * expert_bytes + first * row_bytes.
struct OperandLayout {
  const char* base;
  int64_t expert_bytes, row_bytes;
};

// The size of a problem that is the expert's rows, in CallLayout::sizes.
constexpr int64_t kExpertRows = -1;

// The operands (a, b, c) and sizes (m, n, k: a number, or kExpertRows) of a call's parts: part p's
// problems are columns [p * per_part, (p + 1) * per_part) of pointers [6, stride].
struct CallLayout {
  OperandLayout operands[kMaxParts][3];
  int64_t sizes[kMaxParts][3];
  int64_t parts, per_part, stride;
};

// The addresses of a, b and c and the sizes m, n, k of each part's problem j, the j-th expert with rows.
// A thread per expert counts the experts with rows before it: E is at most a few hundred.
__global__ void grouped_pointers_kernel(const int64_t* offsets, int64_t E, CallLayout call, int64_t* pointers) {
  for (int64_t e = first_index(); e < E; e += grid_stride()) {
    const int64_t first = offsets[e];
    if (offsets[e + 1] == first) continue;
    int64_t j = 0;
    for (int64_t before = 0; before < e; ++before) j += offsets[before + 1] > offsets[before] ? 1 : 0;
    for (int64_t p = 0; p < call.parts; ++p)
      for (int o = 0; o < 3; ++o) {
        const OperandLayout& l = call.operands[p][o];
        const char* address = l.base + e * l.expert_bytes + first * l.row_bytes;
        pointers[o * call.stride + p * call.per_part + j] = static_cast<int64_t>(reinterpret_cast<intptr_t>(address));
        const int64_t size = call.sizes[p][o];
        pointers[(3 + o) * call.stride + p * call.per_part + j] = size == kExpertRows ? offsets[e + 1] - first : size;
      }
  }
}

// The weight gradients of a grouped call's parts that it writes (beta 0), in 32-bit words per expert.
struct IdleExpertGrads {
  char* base[kMaxParts];
  int64_t words[kMaxParts];
  int64_t parts;
};

// Zeroes the gradients of the experts without rows, which a grouped call writing its gradients (beta 0)
// leaves out: one launch for all of them (blockIdx.y the expert), where zeroing each would be a launch per
// idle expert (most of the experts at a few tokens per step).
__global__ void zero_idle_experts_kernel(const int64_t* offsets, IdleExpertGrads grads) {
  const int64_t e = blockIdx.y;
  if (offsets[e + 1] != offsets[e]) return;
  for (int64_t p = 0; p < grads.parts; ++p) {
    auto* words = reinterpret_cast<uint32_t*>(grads.base[p]) + e * grads.words[p];
    for (int64_t i = first_index(); i < grads.words[p]; i += grid_stride()) words[i] = 0;
  }
}

// The blocks per expert: enough to zero an idle expert at memory speed, few enough that the experts with
// rows, whose blocks return at once, cost nothing.
constexpr int64_t kIdleExpertBlocks = 32;

void zero_idle_experts(const Tensor& offsets, const IdleExpertGrads& grads) {
  const int64_t E = offsets.numel() - 1;
  LT_CHECK(E <= kMaxGridY, "cuda grouped matmul: ", E, " experts, more than a grid's y dimension holds");
  int64_t most_words = 0;
  for (int64_t p = 0; p < grads.parts; ++p) most_words = std::max(most_words, grads.words[p]);
  const DeviceGuard guard(offsets.device().index);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(blocks_for(most_words), kIdleExpertBlocks)),
                  static_cast<unsigned>(E));
  LT_CUDA_LAUNCH(grid, kThreadsPerBlock, zero_idle_experts_kernel)(offsets.data<int64_t>(), grads);
  LT_CUDA_CHECK(cudaGetLastError());
}

OperandLayout layout_of(const Tensor& t, Steps steps) {
  const auto bytes = static_cast<int64_t>(dtype_size(t.dtype()));
  return {static_cast<const char*>(t.raw_data()), steps.expert * bytes, steps.row * bytes};
}

// Every row of the operand starts on 16 bytes: its segments and experts, and its rows (the row length).
bool aligned16(const Tensor& t, const OperandLayout& l) {
  return reinterpret_cast<uintptr_t>(l.base) % 16 == 0 && l.expert_bytes % 16 == 0 && l.row_bytes % 16 == 0 &&
         t.dim(-1) * static_cast<int64_t>(dtype_size(t.dtype())) % 16 == 0;
}

// cuBLAS reads whole matrices: the front door gathers an operand by row before it reaches here.
void matmul_in_order(const Tensor& a, const Tensor& a_rows, bool trans_a, const Tensor& b, const Tensor& b_rows,
                     bool trans_b, Tensor& c, double alpha, double beta, MatmulPrecision precision) {
  LT_CHECK(!a_rows.defined() && !b_rows.defined(), "cuda grouped matmul: operands gathered by row reach the device");
  matmul(a, trans_a, b, trans_b, c, alpha, beta, precision);
}

// Mixed precision of products into f32 (MatmulPrecision::BF16Inputs), whose operands may already be
// bf16 (gathered into bf16: tensor/kernels/moe_stats.cpp); f64 stays exact.
bool bf16_inputs(const Tensor& out, MatmulPrecision precision) {
  return precision == MatmulPrecision::BF16Inputs && out.dtype() == DType::F32;
}

// Under mixed precision the parts' inputs rounded to bf16 once for all the experts (the same values as
// rounding each expert's rows), an input that two parts share (x) once, a weight not at all during a
// training step (its copy: bf16_operand).
void round_inputs(std::vector<GroupedGemm::Part>& parts) {
  std::vector<std::pair<Tensor, Tensor>> rounded;  // (input, its bf16 copy)
  auto round = [&rounded](Tensor& x) {
    for (const auto& [input, copy] : rounded)
      if (input.raw_data() == x.raw_data() && input.shape() == x.shape()) {
        x = copy;
        return;
      }
    const Tensor x16 = bf16_operand(x);
    rounded.emplace_back(x, x16);
    x = x16;
  };
  for (GroupedGemm::Part& part : parts) {
    round(part.a);
    round(part.b);
  }
}

// The call over the experts with rows (g's parts and problems filled in, steps[p] the a, b and c steps of
// part p, sizes[p] its problems' m, n and k): the addresses and sizes written from the device's offsets,
// then one grouped GEMM. False, with nothing queued, where it cannot be one call: bf16 operands whose
// rows are not aligned for the tensor-core kernel. The caller then goes expert by expert.
bool grouped_over_experts(GroupedGemm& g, const Tensor& offsets, const std::vector<std::array<Steps, 3>>& steps,
                          const std::vector<std::array<int64_t, 3>>& sizes, MatmulPrecision precision) {
  const bool rounded = bf16_inputs(g.parts.front().c, precision);
  if (g.m.empty()) return true;
  if (rounded) round_inputs(g.parts);
  const int64_t E = offsets.numel() - 1;
  // Sized by the experts, not by those with rows, so that every step asks the allocator for the same
  // sizes (a new size in a later step would go to the driver).
  CallLayout call{};
  call.parts = static_cast<int64_t>(g.parts.size());
  call.per_part = g.problems_per_part();
  call.stride = call.parts * E;
  g.aligned16 = true;
  for (int64_t p = 0; p < call.parts; ++p) {
    const GroupedGemm::Part& part = g.parts[static_cast<size_t>(p)];
    const Tensor* operands[3] = {&part.a, &part.b, &part.c};
    for (int o = 0; o < 3; ++o) {
      call.operands[p][o] = layout_of(*operands[o], steps[static_cast<size_t>(p)][static_cast<size_t>(o)]);
      call.sizes[p][o] = sizes[static_cast<size_t>(p)][static_cast<size_t>(o)];
      g.aligned16 = g.aligned16 && aligned16(*operands[o], call.operands[p][o]);
    }
  }
  if (rounded && !grouped_gemm_bf16_takes(g)) return false;
  const DeviceGuard guard(offsets.device().index);
  g.pointers = Tensor::empty({6, call.stride}, DType::I64, offsets.device());
  LT_CUDA_LAUNCH(blocks_for(E), kThreadsPerBlock, grouped_pointers_kernel)(offsets.data<int64_t>(), E, call,
                                                                          g.pointers.data<int64_t>());
  LT_CUDA_CHECK(cudaGetLastError());
  return grouped_gemm(g, precision);
}

// Splits a list into runs of consecutive entries, at most kMaxParts, in which none reads or writes what
// another writes (`output` and `inputs` of an entry): each run is one grouped call, with the results of
// the list's order. dx's two products, the second adding to the first's result, stay apart.
// Whether two (contiguous) tensors' bytes overlap: the weight gradients are views of one flat buffer.
bool overlap(const Tensor& x, const Tensor& y) {
  const auto* x0 = static_cast<const char*>(x.raw_data());
  const auto* y0 = static_cast<const char*>(y.raw_data());
  return x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes();
}

template <class Entry, class Output, class Inputs, class Run>
void for_each_independent_run(const std::vector<Entry>& list, Output output, Inputs inputs, Run run) {
  auto apart = [&](const Entry& x, const Entry& y) {
    const Tensor &out_x = output(x), &out_y = output(y);
    if (overlap(out_x, out_y)) return false;
    for (const Tensor& in : inputs(x))
      if (overlap(in, out_y)) return false;
    for (const Tensor& in : inputs(y))
      if (overlap(in, out_x)) return false;
    return true;
  };
  size_t first = 0;
  for (size_t i = 1; i <= list.size(); ++i) {
    bool joins = i < list.size() && static_cast<int64_t>(i - first) < kMaxParts;
    for (size_t p = first; joins && p < i; ++p) joins = apart(list[p], list[i]);
    if (!joins) {
      run(first, i);
      first = i;
    }
  }
}

}  // namespace

void grouped_matmuls(const std::vector<GroupedProduct>& products, const Tensor& offsets, const Tensor& host_offsets,
                     MatmulPrecision precision) {
  const int64_t* off = host_offsets.data<int64_t>();
  const int64_t E = offsets.numel() - 1;
  auto by_segments = [&](size_t first, size_t last) {
    for (size_t i = first; i < last; ++i) grouped_matmul_by_segments(products[i], off, precision, matmul_in_order);
  };
  for_each_independent_run(
      products, [](const GroupedProduct& p) -> const Tensor& { return p.out; },
      [](const GroupedProduct& p) { return std::array<Tensor, 2>{p.a, p.w}; },
      [&](size_t first, size_t last) {
        GroupedGemm g{{}, {}, {}, {}, Tensor(), false};
        std::vector<std::array<Steps, 3>> steps;
        std::vector<std::array<int64_t, 3>> sizes;
        for (size_t i = first; i < last; ++i) {
          const GroupedProduct& p = products[i];
          const int64_t K = p.a.dim(1), N = p.out.dim(1);
          // K = 0: no products to sum, each segment is beta times itself, which matmul writes without
          // cuBLAS; N = 0: nothing to write.
          if (K == 0 || N == 0) return by_segments(first, last);
          g.parts.push_back({p.a, p.w, p.out, false, p.trans_w, p.beta});
          steps.push_back({Steps{0, K}, Steps{N * K, 0}, Steps{0, N}});
          sizes.push_back({kExpertRows, N, K});
          for (int64_t e = 0; e < E; ++e) {
            if (off[e + 1] == off[e]) continue;
            g.m.push_back(off[e + 1] - off[e]);
            g.n.push_back(N);
            g.k.push_back(K);
          }
        }
        if (!grouped_over_experts(g, offsets, steps, sizes, precision)) by_segments(first, last);
      });
}

void grouped_weight_grads(const std::vector<GroupedWeightGrad>& grads, const Tensor& offsets,
                          const Tensor& host_offsets, MatmulPrecision precision) {
  const int64_t* off = host_offsets.data<int64_t>();
  const int64_t E = offsets.numel() - 1;
  auto by_segments = [&](size_t first, size_t last) {
    for (size_t i = first; i < last; ++i) grouped_weight_grad_by_segments(grads[i], off, precision, matmul_in_order);
  };
  for_each_independent_run(
      grads, [](const GroupedWeightGrad& g) -> const Tensor& { return g.dw; },
      [](const GroupedWeightGrad& g) { return std::array<Tensor, 2>{g.a, g.b}; },
      [&](size_t first, size_t last) {
        GroupedGemm g{{}, {}, {}, {}, Tensor(), false};
        std::vector<std::array<Steps, 3>> steps;
        std::vector<std::array<int64_t, 3>> sizes;
        IdleExpertGrads idle{{}, {}, 0};
        int64_t idle_experts = 0;
        for (int64_t e = 0; e < E; ++e) idle_experts += off[e + 1] == off[e] ? 1 : 0;
        for (size_t i = first; i < last; ++i) {
          const GroupedWeightGrad& grad = grads[i];
          const int64_t P = grad.dw.dim(1), Q = grad.dw.dim(2);
          if (P == 0 || Q == 0) return by_segments(first, last);
          g.parts.push_back({grad.a, grad.b, grad.dw, true, false, grad.beta});
          steps.push_back({Steps{0, P}, Steps{0, Q}, Steps{P * Q, 0}});
          sizes.push_back({P, Q, kExpertRows});
          for (int64_t e = 0; e < E; ++e) {
            if (off[e + 1] == off[e]) continue;
            g.m.push_back(P);
            g.n.push_back(Q);
            g.k.push_back(off[e + 1] - off[e]);
          }
          if (grad.beta == 0 && idle_experts > 0) {
            idle.base[idle.parts] = static_cast<char*>(grad.dw.raw_data());
            idle.words[idle.parts++] = P * Q * static_cast<int64_t>(dtype_size(grad.dw.dtype())) / 4;
          }
        }
        if (!grouped_over_experts(g, offsets, steps, sizes, precision)) return by_segments(first, last);
        if (idle.parts > 0) zero_idle_experts(offsets, idle);
      });
}

}  // namespace lt::cuda
