#!/usr/bin/env bash
# The measurements behind one column of docs/performance.md's per-CPU table, taken on the CPU this runs
# on: its name and caches; moe-s, moe-m and dense-124m against the PyTorch peer in alternating pairs; the
# per-op profiles (time outside the GEMMs, and each op's two-thread efficiency on moe-m); the GEMM table;
# --dtype bf16 where the CPU has AVX512_BF16; moe-s with both programs capped at AVX2. Every run's output
# stays in OUT; the column is printed as Markdown at the end (and written to OUT/column.md).
#
# Usage: scripts/cpu_column.sh [OUT=out/cpu-column] [PAIRS=3] [PEER=../shared/peers/torch_ling.py]
# Environment: LINGTRAIN (default build/lingtrain), PEER_PYTHON (the interpreter with torch; default
# /usr/bin/python3 when it has torch, else python3). Without a peer script the lingtrain half still runs.
#
# Two threads, pinned with taskset to two CPUs of different cores when it can: on a machine with more
# cores the pair then shares nothing but the L3, and two SMT siblings never stand in for two cores.
# The runs are sequential: 6 minutes with 1 pair on a 2-core Zen 4, about 12 with 3. A loaded host moves
# every figure, so the pairs alternate and the ratios are medians of per-pair ratios.
set -euo pipefail
out=${1:-out/cpu-column}
pairs=${2:-3}
peer=${3:-../shared/peers/torch_ling.py}
lingtrain=$(realpath "${LINGTRAIN:-build/lingtrain}")
[ -x "$lingtrain" ] || { echo "cpu_column: no lingtrain at $lingtrain (build it first: make build)" >&2; exit 1; }
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "cpu_column: PAIRS must be a positive integer, got '$pairs'" >&2; exit 1; }
mkdir -p "$out"

python=${PEER_PYTHON:-}
if [ -z "$python" ]; then
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then python=/usr/bin/python3; else python=python3; fi
fi
if [ -f "$peer" ] && "$python" -c 'import torch, numpy' 2>/dev/null; then
  peer=$(realpath "$peer")
else
  echo "cpu_column: no PyTorch peer ($peer with $python): measuring lingtrain alone" >&2
  peer=
fi
# PyTorch on Debian must load the OpenMP build of OpenBLAS (docs/performance.md, "Running it").
openblas=/usr/lib/x86_64-linux-gnu/openblas-openmp
peer_env=(env OMP_NUM_THREADS=2)
[ -d "$openblas" ] && peer_env+=(LD_LIBRARY_PATH="$openblas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")

pin=()
if command -v taskset >/dev/null && command -v lscpu >/dev/null; then
  cpus=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | head -2 | cut -d, -f1 | paste -sd,)
  [[ $cpus == *,* ]] && pin=(taskset -c "$cpus")
fi

{
  lscpu 2>/dev/null || true
  for cache in /sys/devices/system/cpu/cpu0/cache/index*; do
    [ -r "$cache/size" ] && echo "cache L$(cat "$cache/level") $(cat "$cache/type") $(cat "$cache/size")"
  done
  "$lingtrain" version
  echo "commit: $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "date: $(date -u +%Y-%m-%d)"
} >"$out/cpu.txt" 2>&1

# NAME COMMAND...: one run, its whole output in NAME.txt and its last line (one JSON object) in NAME.json.
run() {
  local name=$1
  shift
  echo "cpu_column: $name" >&2
  "$@" >"$out/$name.txt" 2>&1 || { echo "cpu_column: $name failed, see $out/$name.txt" >&2; exit 1; }
  tail -n 1 "$out/$name.txt" >"$out/$name.json"
}
peer_name() { [ "$1" = dense-124m ] && echo ling-dense-124m || echo "$1"; }

for config in moe-s moe-m dense-124m; do
  for ((i = 1; i <= pairs; ++i)); do
    run "lt-$config-$i" "${pin[@]}" "$lingtrain" bench --config "$config" --threads 2
    [ -n "$peer" ] && run "pt-$config-$i" "${pin[@]}" "${peer_env[@]}" "$python" "$peer" bench \
      --config "$(peer_name "$config")" --threads 2
  done
done
run kernels "${pin[@]}" "$lingtrain" bench --part kernels --threads 2
run prof-moe-s "${pin[@]}" "$lingtrain" bench --config moe-s --threads 2 --profile 1
run prof-moe-m "${pin[@]}" "$lingtrain" bench --config moe-m --threads 2 --profile 1
run prof-moe-m-1 "${pin[@]}" "$lingtrain" bench --config moe-m --threads 1 --profile 1
if grep -q ", bf16 GEMM (" "$out/cpu.txt"; then
  for config in moe-s moe-m; do run "bf16-$config" "${pin[@]}" "$lingtrain" bench --config "$config" --threads 2 --dtype bf16; done
fi
run avx2-lt-moe-s "${pin[@]}" env LINGTRAIN_CPU_TARGET=AVX2 "$lingtrain" bench --config moe-s --threads 2
[ -n "$peer" ] && run avx2-pt-moe-s "${pin[@]}" "${peer_env[@]}" ATEN_CPU_CAPABILITY=avx2 \
  MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell "$python" "$peer" bench --config moe-s --threads 2

python3 - "$out" "$pairs" <<'EOF' | tee "$out/column.md"
import json, os, statistics, sys

out, pairs = sys.argv[1], int(sys.argv[2])
def load(name):
    path = os.path.join(out, name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None
def spread(values, fmt):
    values = sorted(values)
    med = statistics.median(values)
    return fmt.format(med) + (" (" + fmt.format(values[0]) + "-" + fmt.format(values[-1]) + ")" if len(values) > 1 else "")

lines = open(os.path.join(out, "cpu.txt")).read().splitlines()
def field(name, default=""):
    return next((l.split(":", 1)[1].strip() for l in lines if l.startswith(name + ":")), default)
print(f"| {field('Model name', 'unknown CPU')} ({field('cpu kernels')}) | measured {field('date')}, "
      f"commit `{field('commit')}` |")
print("|---|---|")
k = load("kernels")
peaks = " / ".join(f"{p['gflops']:.1f}" for p in k["fma_peak"])
print(f"| FMA peak, 1 / 2 threads | {peaks} GFLOP/s |")
one_peak, two_peak = (p["gflops"] for p in k["fma_peak"])
if two_peak < 1.5 * one_peak:
    print(f"cpu_column: the 2-thread FMA peak measured {two_peak / one_peak:.2f}x the 1-thread one: another process "
          "held a core, so the 2-thread GEMM percentages are off; rerun on a quieter host", file=sys.stderr)
rows = {}
for config in ("moe-s", "moe-m", "dense-124m"):
    lt = [load(f"lt-{config}-{i}") for i in range(1, pairs + 1)]
    pt = [load(f"pt-{config}-{i}") for i in range(1, pairs + 1)]
    rows[config] = lt
    if all(pt):
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(lt, pt)]
        rss = statistics.median(b["ru_maxrss_mb"] for b in pt)
        print(f"| {config} vs PyTorch, tokens/s | {spread(ratios, '{:.2f}x')}; peak RSS "
              f"{statistics.median(a['peak_rss_mb'] for a in lt):.0f} / {rss:.0f} MiB |")
mfu = " / ".join(spread([100 * r["mfu"] for r in rows[c]], "{:.1f}%") for c in rows)
print(f"| step MFU moe-s / moe-m / dense-124m | {mfu} |")
for t in (1, 2):
    pct = [r["percent_of_peak"] for g in k["gemm"] for r in g["results"] if r["threads"] == t]
    below = sum(p < 85 for p in pct)
    print(f"| GEMM % of peak, bench shapes, {t} thread{'s' if t > 1 else ''} | {min(pct):.1f}-{max(pct):.1f}% "
          f"({below} of {len(pct)} below 85%) |")
gemm_ops = ("matmul", "matmul_add", "grouped_matmul", "normhead_cross_entropy")
def outside(profile):
    ops = profile["ops"]
    total = sum(o["ms_per_step"] for o in ops)
    return 100 * sum(o["ms_per_step"] for o in ops if o["op"] not in gemm_ops) / total
print(f"| moe-m time outside GEMMs | {outside(load('prof-moe-m')):.1f}% (moe-s {outside(load('prof-moe-s')):.1f}%) |")
one, two = load("prof-moe-m-1")["ops"], load("prof-moe-m")["ops"]
def efficiency(select):
    t1 = sum(o["ms_per_step"] for o in one if select(o["op"]))
    t2 = sum(o["ms_per_step"] for o in two if select(o["op"]))
    return t1 / (2 * t2)
print(f"| two-thread efficiency, GEMMs / the rest (moe-m) | {efficiency(lambda op: op in gemm_ops):.2f} / "
      f"{efficiency(lambda op: op not in gemm_ops):.2f} |")
if load("bf16-moe-s"):
    speedups = [load(f"bf16-{c}")["tokens_per_s"] / statistics.median(r["tokens_per_s"] for r in rows[c])
                for c in ("moe-s", "moe-m")]
    print(f"| bf16 peak ({load('bf16-moe-s')['peak_unit']}), 2 threads | {load('bf16-moe-s')['peak_gflops']:.1f} GFLOP/s |")
    print(f"| bf16 vs f32 tokens/s, moe-s / moe-m | {speedups[0]:.2f}x / {speedups[1]:.2f}x |")
else:
    print("| `--dtype bf16` | no AVX512_BF16 (or capped below it): the run stays f32 |")
capped_lt, capped_pt = load("avx2-lt-moe-s"), load("avx2-pt-moe-s")
line = f"| moe-s capped at AVX2 | MFU {100 * capped_lt['mfu']:.1f}%"
if capped_pt:
    line += f", {capped_lt['tokens_per_s'] / capped_pt['tokens_per_s']:.2f}x PyTorch (one pair)"
print(line + " |")
per_op = sorted(((o["op"], o["phase"]) for o in two if o["op"] != "(outside every scope)"),
                key=lambda key: -next(o["ms_per_step"] for o in two if (o["op"], o["phase"]) == key))[:10]
print()
print("moe-m per op, ms per step on 2 threads (1 thread), two-thread efficiency, and the threads' waits at the")
print("ends of the op's fork-joins on 2 threads (ms of thread time per step):")
print()
print("| op | phase | 2 threads | 1 thread | efficiency | waits |")
print("|---|---|---|---|---|---|")
for op, phase in per_op:
    row2 = next(o for o in two if (o["op"], o["phase"]) == (op, phase))
    t2 = row2["ms_per_step"]
    t1 = next((o["ms_per_step"] for o in one if (o["op"], o["phase"]) == (op, phase)), float("nan"))
    print(f"| {op} | {phase} | {t2:.1f} | {t1:.1f} | {t1 / (2 * t2):.2f} | {row2.get('wait_ms_per_step', float('nan')):.1f} |")
EOF
