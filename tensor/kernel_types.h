// Types that the kernel interface (tensor/kernels.h) and both backends (tensor/cpu/kernels.h,
// tensor/cuda/kernels.h) share, so that neither backend header needs the other.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace lt::kernels {

// The entries of dpo_loss's stats [kDpoStats] (tensor/kernels.def): sums over the pairs (and tokens).
enum DpoStat {
  kDpoRewardChosen, kDpoRewardRejected, kDpoCorrect, kDpoMargin, kDpoLogpChosen, kDpoLogpRejected,
  kDpoLoss, kDpoNllSum, kDpoNllTokens, kDpoPairs, kDpoStats
};

// The binary elementwise ops: one kernel per backend, parameterised by the op.
enum class BinaryOp { Add, Sub, Mul };

// The precision of matmuls of f32 tensors (kernels::set_matmul_precision): exact f32; mixed
// precision, the operands rounded to bf16 as they enter the tensor cores (GPU) or the bf16 packing of
// the GEMM (CPUs with AVX512_BF16) and the products summed in f32 into an f32 result; or TF32, a GPU
// mode: cuBLAS may round the f32 operands to TF32 (10 mantissa bits) on the tensor cores and sum in f32
// (CUBLAS_COMPUTE_32F_FAST_TF32), while the CPU and the emulated GPU multiply in plain f32. Everything
// else (master weights, optimiser state, norms, softmax statistics, losses) stays f32 either way.
enum class MatmulPrecision { F32, BF16Inputs, TF32 };
// Its name as --dtype spells it: f32, bf16 or tf32.
inline const char* matmul_precision_name(MatmulPrecision precision) {
  return precision == MatmulPrecision::BF16Inputs ? "bf16" : precision == MatmulPrecision::TF32 ? "tf32" : "f32";
}

// One product of kernels::grouped_matmuls: for each expert e with rows R_e, out[R_e] = a[R_e] w[e]^T
// (trans_w) or a[R_e] w[e], plus beta out[R_e].
struct GroupedProduct {
  Tensor a, w;
  bool trans_w;
  Tensor out;
  double beta;
  // Optional i32 [M]: row m of the product reads a's row a_rows[m] (a [R, K], any R), e.g. the tokens'
  // rows in dispatch order, without a gathered copy of them.
  Tensor a_rows = {};
};
// One weight gradient of kernels::grouped_weight_grads: dw[e] = a[R_e]^T b[R_e], plus dw[e] if beta = 1.
// With a_rows (b_rows), optional i32 [M], row m of a (b) is a[a_rows[m]] (b[b_rows[m]]).
struct GroupedWeightGrad {
  Tensor a, b, dw;
  double beta;
  Tensor a_rows = {}, b_rows = {};
};

// The largest k that router_topk_backward takes: the size of its per-row scratch, on every backend.
inline constexpr int64_t kRouterMaxTopK = 64;

// The hyperparameters of one AdamW step (kernels::adamw_step).
struct AdamWStep {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t t;  // 1-based step count for the bias corrections
  double grad_scale = 1.0;

  // The bias corrections folded into two scalars, as every backend's kernel applies them:
  //   p = p (1 - lr wd) - step_size() m / (sqrt(v) inv_sqrt_bias_correction2() + eps).
  double step_size() const { return lr / (1.0 - std::pow(beta1, static_cast<double>(t))); }
  double inv_sqrt_bias_correction2() const { return 1.0 / std::sqrt(1.0 - std::pow(beta2, static_cast<double>(t))); }
};

// Elements [begin, end) of the flat tensors of an AdamW step, stepped with the step's weight decay or
// without (weight decay 0): the parameters that have gradients, by decay group (optim/adamw.cpp).
struct AdamWRun {
  int64_t begin, end;
  bool weight_decay;
  bool operator==(const AdamWRun&) const = default;
};
// The runs an AdamW step of n elements takes: `runs`, or where it is empty every element, with the decay.
inline std::vector<AdamWRun> stepped_runs(const std::vector<AdamWRun>& runs, int64_t n) {
  return runs.empty() ? std::vector<AdamWRun>{{0, n, true}} : runs;
}

// The first id of an index tensor outside [0, bound) (and not the ignored id, where one is allowed):
// its position in the flattened tensor and its value; position -1 when every id is in range.
struct IndexRange {
  int64_t bound;
  bool has_ignored = false;
  int64_t ignored = 0;

  bool allows(int64_t id) const { return (id >= 0 && id < bound) || (has_ignored && id == ignored); }
};
struct OutOfRange {
  int64_t position = -1, value = 0;
};

}  // namespace lt::kernels
