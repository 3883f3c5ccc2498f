// The kernel interface: every numeric routine the layers above call, device-dispatched.
//
// Each op family has one front door, tensor/kernels/<family>.cpp: it checks the operands (shapes,
// dtypes, one device) and runs the kernel of the operands' device, from one of two peer backends that
// check nothing themselves: the CPU kernels of tensor/cpu/<family>.cc (Highway, dynamic dispatch, f32
// and f64) and the CUDA kernels of tensor/cuda/<family>.cu (every op has one; cuBLAS for the GEMMs).
// Every signature is written once, in tensor/kernels.def, which this header and both backend headers
// expand into their namespaces.
//
// Index operands are range-checked on their own device before a kernel lets them address memory (on a
// GPU, except inside a TrustedDeviceIndices scope). Outputs
// are passed in, already allocated, so callers decide where memory comes from. Forward and backward of a
// family sit side by side.
//
// Determinism: for a given thread count, every kernel returns bit-identical results run after run
// (work is split by lt::parallel_for, reductions combine chunk results in chunk order, no atomics; the
// CUDA kernels likewise reduce in a fixed order and add nothing atomically: their one atomic, an integer
// ticket, only tells which block finishes a reduction, tensor/cuda/last_block.h).
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/kernel_types.h"
#include "tensor/tensor.h"

namespace lt::cpu {
struct ReusedOperands;
}  // namespace lt::cpu

namespace lt::kernels {

// The front doors, with their contracts: tensor/kernels.def, the one list of every kernel's signature.
#define LT_KERNEL(name, parameters) void name parameters;
#define LT_FRONT_DOOR(name, parameters) void name parameters;
#define LT_BACKEND_KERNEL(name, parameters)
#include "tensor/kernels.def"
#undef LT_KERNEL
#undef LT_FRONT_DOOR
#undef LT_BACKEND_KERNEL

// While one lives on this thread, the front doors skip the range check of index tensors on a GPU, which
// waits for the device to read back its answer. For work whose indices are known good: those the
// project's own kernels produce (the router's expert ids, the dispatch's rows and positions) and host
// data checked on the host before it was copied (a training step's batch: Trainer::step). Indices on the
// CPU are always checked; there the check costs no wait.
class TrustedDeviceIndices {
 public:
  TrustedDeviceIndices();
  ~TrustedDeviceIndices();
  TrustedDeviceIndices(const TrustedDeviceIndices&) = delete;
  TrustedDeviceIndices& operator=(const TrustedDeviceIndices&) = delete;
};
bool device_indices_trusted();

// While one lives on this thread, the given tensors are constants (nothing writes them until it ends), and
// a CPU matmul on this thread whose b lies in one of them and that takes the panel path with few rows
// (13 to 24 rows of c) packs that b once, at its second use, and reuses the packed copy until the scope
// ends: the same bits
// as packing it at every call. For the many forwards of decoding over unchanged weights, where packing
// the weights for 16 rows cost as much as their product. Holds up to one packed copy of the constants
// (their size, columns rounded up to whole panels). GPU matmuls are unaffected. Scopes nest: the
// innermost one on this thread applies.
class ReusedMatmulOperands {
 public:
  explicit ReusedMatmulOperands(std::vector<Tensor> constants);
  ~ReusedMatmulOperands();
  ReusedMatmulOperands(const ReusedMatmulOperands&) = delete;
  ReusedMatmulOperands& operator=(const ReusedMatmulOperands&) = delete;

 private:
  cpu::ReusedOperands* operands_;
};

// The first id of `ids` that `range` does not allow (position -1 when there is none), on the host:
// for checking host data before it is copied to a device.
OutOfRange first_out_of_range_on_host(const Tensor& ids, const IndexRange& range);

// The precision of every later matmul (and grouped matmul) of f32 tensors: process-wide, set once per
// run (--dtype bf16, --dtype tf32). On the CPU, BF16Inputs takes effect where cpu_has_bf16_matmul() and
// matmuls of more than 12 rows (the rest stay f32), and TF32 is plain f32; f64 is always exact.
void set_matmul_precision(MatmulPrecision precision);
MatmulPrecision matmul_precision();
// True when this CPU has a bf16 GEMM (AVX512_BF16: Zen 4, Sapphire Rapids and later).
bool cpu_has_bf16_matmul();
// What the bf16 GEMM multiplies on: "AMX tiles" (Xeons from Sapphire Rapids on, tensor/cpu/amx.h),
// "AVX512_BF16" (VDPBF16PS), or nullptr where there is no bf16 GEMM.
const char* cpu_bf16_matmul_unit();

}  // namespace lt::kernels

namespace lt {
// The Highway target the CPU kernels dispatch to on this machine ("AVX3_DL", "AVX2", ...).
const char* cpu_kernel_target();
// The L2 cache of one core of this machine in bytes, read once: the level-2 data or unified cache in
// /sys/devices/system/cpu/cpu0/cache, else sysconf; 1 MiB when neither says. The GEMM sizes its packed
// blocks by it (tensor/cpu/gemm.cc).
int64_t cpu_l2_cache_bytes();
// Caps the CPU kernels at the Highway target named by the environment variable LINGTRAIN_CPU_TARGET
// (any case), if it is set: from then on they dispatch to the newest target no newer than it. For
// measuring and testing an older CPU's code path (AVX2, as on Zen 3) on a newer one. Called at start-up,
// before any kernel runs; throws on a name this build has no target for and on one this CPU cannot run.
// Reads LINGTRAIN_CPU_AMX as well (0: the bf16 GEMM keeps off a Xeon's AMX tiles; 1 or unset: it uses
// them where the CPU has them; anything else throws).
void cap_cpu_target_from_environment();
}  // namespace lt
