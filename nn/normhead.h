// NormHead (docs/architecture.md §4) and the fused head + loss ops built on it: the mean cross-entropy of
// pre-training and SFT, and the per-token log-probabilities DPO sums. Neither materialises the
// [N, V] logits: rows go through the head in chunks.
#pragma once
#include <cstdint>

#include "autograd/variable.h"

namespace lt {

// NormHead: logits = h (W / ||W||_col)^T, each hidden column of W [V, H] scaled to unit L2 norm over the
// vocabulary (eps 1e-7). The raw W is the parameter. With `detached` the denominator is a constant in
// backward (the Hugging Face training path); otherwise the full Jacobian of the normalisation is used.
Variable column_normalize(const Variable& w_VH, bool detached);

// The rows of h whose logits exist at a time in the head's chunked passes ([rows, vocab] of dtype): 256
// on a CPU; on a GPU up to 128 MiB of logits (fewer, larger chunks: each costs launches).
int64_t head_rows_per_chunk(int64_t vocab, DType dtype, bool on_gpu);

// How the head enters the loss: as it is (norm_head false), or column-normalised with the norm
// detached or with its full Jacobian, as in column_normalize.
enum class HeadNorm { None, Detached, Full };

// The mean cross-entropy of logits = h W'^T (W' the head normalised per `norm`) against targets [N]
// (i32/i64; ignore_index skipped, 0 when every target is), scalar [1], as
// cross_entropy(matmul(h, column_normalize(W), false, true), targets) but without the [N, V] logits:
// the rows go through in chunks, and the forward turns each chunk's logits into its gradient at once
// (the loss is a scalar, so the backward only scales), so only one chunk of [rows, V] ever exists.
// h [N, H], W [V, H].
Variable normhead_cross_entropy(const Variable& h_NH, const Variable& head_VH, const Tensor& targets_N,
                                int64_t ignore_index, HeadNorm norm);

// The log-probability of each row's target, [N]:
//   out[n] = log softmax(logits[n])[targets[n]], 0 where targets[n] == ignore_index,
// logits = h W'^T as in normhead_cross_entropy, h [N, H], targets [N]. What DPO sums per response (nn/dpo_loss.h).
// Differentiable in h and W: the backward recomputes the logits chunk by chunk from the saved
// log-sum-exps (the upstream gradient differs per row, so it cannot be folded into the forward), again
// without the [N, V] logits.
Variable normhead_token_logprobs(const Variable& h_NH, const Variable& head_VH, const Tensor& targets_N,
                                 int64_t ignore_index, HeadNorm norm);

}  // namespace lt
