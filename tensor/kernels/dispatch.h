// What every front door of tensor/kernels/<family>.cpp shares: the argument checks, and the choice of
// the backend that runs the op. The front doors check everything a kernel relies on (dtypes, shapes,
// one device, index ranges), so the kernels of tensor/cpu/ and tensor/cuda/ check nothing.
#pragma once
#include <initializer_list>
#include <utility>

#include "tensor/cpu/kernels.h"
#include "tensor/cuda/kernels.h"
#include "tensor/device_runtime.h"
#include "tensor/dtype_switch.h"
#include "tensor/kernels.h"

// A front door calls lt::cuda only inside `if constexpr (kCudaBackend)` (tensor/device_runtime.h): without
// the backend that call is a discarded statement, which needs no definition to link, and no CUDA tensor
// can exist to reach it.
namespace lt::kernels {

inline void check_float(const Tensor& t, const char* op, const char* what) {
  LT_CHECK(t.defined(), op, ": ", what, " is undefined");
  LT_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F64, op, ": ", what, " must be f32 or f64, got ", t.str());
}

inline void check_index(const Tensor& t, const char* op, const char* what) {
  LT_CHECK(t.defined(), op, ": ", what, " is undefined");
  LT_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64, op, ": ", what, " must be i32 or i64, got ", t.str());
}

// Same dtype and device as the reference operand.
inline void check_like(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  LT_CHECK(t.defined(), op, ": ", what, " is undefined");
  LT_CHECK(t.dtype() == ref.dtype() && t.device() == ref.device(), op, ": ", what, " is ", t.str(), ", expected ",
           dtype_name(ref.dtype()), " on ", ref.device().str());
}

// An operand a kernel reads as autograd kept it (autograd/saved.h): like ref, or under mixed precision on
// a GPU (ref f32) its bf16 copy, which the kernel takes as it is (the GEMMs as their rounded operand, the
// backward kernels widening each element as they read it).
inline void check_kept(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  const bool bf16_copy = t.defined() && t.dtype() == DType::BF16 && ref.dtype() == DType::F32 && !t.is_cpu() &&
                         t.device() == ref.device() && matmul_precision() == MatmulPrecision::BF16Inputs;
  if (!bf16_copy) check_like(t, ref, op, what);
}

// An operand as autograd kept it, for the kernels that read a kept copy on a CPU too: check_kept, and
// under mixed precision its bf16 copy on the CPU (autograd/saved.h): the GEMMs, which move its pairs into
// the packing or widen it where they multiply in f32, and swiglu_combine_backward and rmsnorm_backward,
// which widen it as they read.
inline void check_kept_anywhere(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  const bool cpu_copy = t.defined() && t.is_cpu() && ref.is_cpu() && t.dtype() == DType::BF16 &&
                        ref.dtype() == DType::F32 && matmul_precision() == MatmulPrecision::BF16Inputs;
  if (!cpu_copy) check_kept(t, ref, op, what);
}

// Same device as the reference operand (an index tensor next to float data).
inline void check_device(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  LT_CHECK(t.device() == ref.device(), op, ": ", what, " is ", t.str(), ", expected it on ", ref.device().str());
}

inline void check_shape(const Tensor& t, const Shape& shape, const char* op, const char* what) {
  LT_CHECK(t.shape() == shape, op, ": ", what, " has shape ", shape_str(t.shape()), ", expected ", shape_str(shape));
}

// check_kept, and ref's shape.
inline void check_kept_same(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  check_kept(t, ref, op, what);
  check_shape(t, ref.shape(), op, what);
}

// The bf16 copy of ref that an op writes under mixed precision in the pass that reads or writes ref
// (autograd/saved.h: kept_copy_to_fill), on a GPU or a CPU: bf16, ref's shape.
inline void check_bf16_copy(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  LT_CHECK(t.dtype() == DType::BF16, op, ": ", what, " must be bf16, got ", t.str());
  check_kept_anywhere(t, ref, op, what);
  check_shape(t, ref.shape(), op, what);
}

// Same dtype, device and shape as the reference operand.
inline void check_same(const Tensor& t, const Tensor& ref, const char* op, const char* what) {
  check_like(t, ref, op, what);
  check_shape(t, ref.shape(), op, what);
}

// A fused gate and up projection gate_up [..., 2C] (gate in the first C columns, up in the last) and a
// tensor of its halves' shape [..., C], `half` (check_kept against ref: its dtype may be a kept copy's).
inline void check_gate_up(const Tensor& gate_up, const Tensor& half, const Tensor& ref, const char* op,
                          const char* what) {
  LT_CHECK(gate_up.ndim() >= 1 && gate_up.dim(-1) % 2 == 0, op, ": gate_up must end in an even dimension (gate and up "
           "side by side), got ", gate_up.str());
  check_kept(half, ref, op, what);
  const bool fits = half.ndim() == gate_up.ndim() && half.dim(-1) * 2 == gate_up.dim(-1) &&
                    half.numel() * 2 == gate_up.numel();
  LT_CHECK(fits, op, ": ", what, " has shape ", shape_str(half.shape()), ", expected gate_up's ",
           shape_str(gate_up.shape()), " with its last dimension halved");
}

// `out`, which the op writes while it still reads `in`, shares no byte with it (their contiguous spans
// of storage are disjoint): an op summing into its outputs as it goes would read its own partial sums.
inline void check_disjoint(const Tensor& out, const Tensor& in, const char* op, const char* out_name,
                           const char* in_name) {
  if (out.nbytes() == 0 || in.nbytes() == 0) return;
  const char* out_begin = static_cast<const char*>(out.raw_data());
  const char* in_begin = static_cast<const char*>(in.raw_data());
  LT_CHECK(out_begin >= in_begin + in.nbytes() || in_begin >= out_begin + out.nbytes(), op, ": ", out_name,
           " overlaps ", in_name, " in memory (the op writes ", out_name, " while it still reads ", in_name, ")");
}

// No output shares memory with an input or with another output.
using NamedTensor = std::pair<const Tensor*, const char*>;
inline void check_outputs_apart(const char* op, std::initializer_list<NamedTensor> outputs,
                                std::initializer_list<NamedTensor> inputs) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (const auto& [in, name] : inputs) check_disjoint(*out->first, *in, op, out->second, name);
    for (auto other = out + 1; other != outputs.end(); ++other)
      check_disjoint(*out->first, *other->first, op, out->second, other->second);
  }
}

// The first id of `ids` that `range` does not allow (position -1 when there is none). CPU ids are
// scanned on the host, few next to the data they address; CUDA ids on their device, which waits for
// the GPU to read back the answer, unless they are trusted (TrustedDeviceIndices, tensor/kernels.h).
inline OutOfRange first_out_of_range(const Tensor& ids, const IndexRange& range) {
  if constexpr (kCudaBackend) {
    if (!ids.is_cpu()) return device_indices_trusted() ? OutOfRange{} : cuda::first_out_of_range(ids, range);
  }
  return first_out_of_range_on_host(ids, range);
}

// Every index in [0, bound), checked before a kernel lets one address memory.
inline void check_indices(const Tensor& idx, int64_t bound, const char* op) {
  const OutOfRange bad = first_out_of_range(idx, IndexRange{bound});
  LT_CHECK(bad.position < 0, op, ": index ", bad.value, " at position ", bad.position, " is out of range [0, ", bound,
           ")");
}

// A routing's probs [N, E] (float) and the log-sum-exp
// lse [N] of its rows, as the router's kernels take them.
inline void check_probs_and_lse(const Tensor& probs, const Tensor& lse, const char* op) {
  check_float(probs, op, "probs");
  LT_CHECK(probs.ndim() == 2, op, ": probs must be [N, E], got ", probs.str());
  check_like(lse, probs, op, "lse");
  check_shape(lse, {probs.dim(0)}, op, "lse");
}

// A routing's probs [N, E] (float) and the experts ids [N, k] (i32) chosen from them, on one device.
inline void check_router_rows(const Tensor& probs, const Tensor& ids, const char* op) {
  check_float(probs, op, "probs");
  LT_CHECK(probs.ndim() == 2, op, ": probs must be [N, E], got ", probs.str());
  LT_CHECK(ids.defined() && ids.dtype() == DType::I32 && ids.ndim() == 2 && ids.dim(0) == probs.dim(0), op,
           ": ids must be i32 [", probs.dim(0), ", k], got ", ids.defined() ? ids.str() : "undefined");
  check_device(ids, probs, op, "ids");
}

// router_topk's operands: logits [N, E], k in [1, E], and the outputs probs [N, E], lse [N], weights
// [N, k] in the logits' dtype and ids [N, k] i32, on the logits' device.
inline void check_router_topk(const Tensor& logits, int64_t k, const Tensor& probs, const Tensor& lse,
                              const Tensor& weights, const Tensor& ids, const char* op) {
  check_float(logits, op, "logits");
  LT_CHECK(logits.ndim() == 2, op, ": logits must be [N, E], got ", logits.str());
  const int64_t N = logits.dim(0), E = logits.dim(1);
  LT_CHECK(k >= 1 && k <= E, op, ": k = ", k, " must be in [1, ", E, "]");
  check_same(probs, logits, op, "probs");
  check_like(lse, logits, op, "lse");
  check_shape(lse, {N}, op, "lse");
  check_like(weights, logits, op, "weights");
  check_shape(weights, {N, k}, op, "weights");
  check_router_rows(probs, ids, op);
  check_shape(ids, {N, k}, op, "ids");
}

}  // namespace lt::kernels
