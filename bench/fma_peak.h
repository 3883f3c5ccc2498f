// The machine's fp32 FMA peak as this binary can reach it: the yardstick for GEMM efficiency and MFU;
// and on CPUs with AVX512_BF16 the peak of the unit the bf16 GEMM multiplies on, that of --dtype bf16.
#pragma once

namespace lt::bench {

struct FmaPeak {
  double gflops = 0;        // all threads together
  int threads = 0;
  const char* target = "";  // the Highway target the loop ran on (e.g. AVX3_DL)
};

// Runs a loop of independent FMA chains on `threads` threads of lt's pool (each thread its own
// chains) for about `seconds` in total, and returns the best rate of its many short repetitions: the
// peak is a property of the machine, and a moment when another process holds a core should not lower
// it. On a machine that stays busy for the whole second it still reads low (and MFU high).
FmaPeak measure_fma_peak(int threads, double seconds = 1.0);
// The same with the bf16 GEMM's instruction: TDPBF16PS on the AMX tiles where the GEMM uses them (target
// "AMX"), else VDPBF16PS chains (two FMAs per f32 lane per instruction; "AVX512_BF16"). Call only
// where kernels::cpu_has_bf16_matmul().
FmaPeak measure_bf16_peak(int threads, double seconds = 1.0);

}  // namespace lt::bench
