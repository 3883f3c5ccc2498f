#!/usr/bin/env bash
# The GPU check of issue 40, one script for a machine with a GPU, run from the repository root with the
# binaries built beforehand (on a machine without a GPU: `scripts/gpu_check.sh --prepare`). It runs
#   - the GPU tests of lingtrain_tests (GPU_TESTS below; without a GPU they skip),
#   - the tiny model trained twice in bf16 (SAME_BITS_STEPS steps, 20), the weights compared byte for byte,
#   - `lingtrain bench --device cuda` for every config in CONFIGS and dtype in DTYPES, with the device
#     counters (launches, host syncs, GEMM calls, ...),
#   - the PyTorch peer on the same GPU for each config, bf16 autocast with SDPA attention and fused AdamW,
#     eager and then under torch.compile (PEER; "peer: not found" when it is absent),
#   - a profile of one training step (PROFILE) under nsys, else ncu, else none,
# and writes OUT/gpu_check.json (everything, one object), OUT/gpu_check.md (one table),
# OUT/gpu_check_logs.tar.gz (every part's output) and the profiler's report, at most 4 files. Both
# reports are rewritten after every part, so a run stopped from outside still leaves the parts before.
#
# Time: every part runs under `timeout` (PART_S, TESTS_S) and the whole under TOTAL_S; a part that
# times out is recorded and the script goes on; a part with too little time left is recorded as skipped.
# The order puts what matters first: tests, then per config lingtrain and the eager peer, the profile,
# and the compiled peer (the slowest to start) last. Defaults fit an H100 in 8 minutes.
#
# Usage: OUT=DIR scripts/gpu_check.sh          (DIR empty or new; default out/gpu-check)
#        scripts/gpu_check.sh --prepare        (here: build the CUDA binaries, record their commit)
# Environment, all optional:
#   LINGTRAIN (build/lingtrain), LINGTRAIN_TESTS (build/lingtrain_tests; "none" skips the tests)
#   CONFIGS ("moe-s moe-m ling-lite-4l"; names or config files), DTYPES ("f32 tf32 bf16")
#   SHAPE (BxT for every run, e.g. 1x32; default each config's bench shape)
#   STEPS, WARMUP (measured and warm-up steps; default 10 and 3, ling-lite-4l 3 and 1)
#   PEER (../shared/peers/torch_ling.py; "none" skips it), PEER_PYTHON (python3)
#   PROFILE ("moe-m bf16": config and dtype of the profiled step; "none" skips it), PROFILE_KERNELS
#   (4000: ncu times at most so many launches, each alone, so that a slow profiler still ends in time)
#   GPU_TESTS (gtest filter), TOTAL_S (450), PART_S (120), TESTS_S (120), SAME_BITS_STEPS (20; 0 skips it)
#   GIT_COMMIT (the commit to record; else git's, else the file --prepare writes beside LINGTRAIN)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# Paths given in the environment are the caller's; the defaults are the repository's.
from_caller() { case $1 in /* | none) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
out=$(from_caller "${OUT:-$repo/out/gpu-check}")
lingtrain=$(from_caller "${LINGTRAIN:-$repo/build/lingtrain}")
tests_bin=$(from_caller "${LINGTRAIN_TESTS:-$repo/build/lingtrain_tests}")
peer=$(from_caller "${PEER:-$repo/../shared/peers/torch_ling.py}")
configs=()
for config in ${CONFIGS:-moe-s moe-m ling-lite-4l}; do
  [ -f "$config" ] && config=$(from_caller "$config")
  configs+=("$config")
done
cd "$repo" || exit 1

die() { echo "gpu_check: $*" >&2; exit 1; }
commit_file_of() { echo "$(dirname "$1")/gpu_check_commit.txt"; }
libs_dir_of() { echo "$(dirname "$1")/gpu_check_libs"; }
git_commit() {
  local commit
  commit=$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null) || return 1
  [ -z "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ] || commit+=" with uncommitted changes"
  echo "$commit"
}

if [ "${1:-}" = "--prepare" ]; then
  # The binaries the GPU machine runs, built here (CUDA build: nvcc, sm_80 and sm_90), and the commit
  # they were built from, for a copy of the tree that has no .git.
  build=${BUILD:-build}
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" || die "cmake could not configure $build"
  fi
  cmake --build "$build" -j "${JOBS:-2}" --target lingtrain lingtrain_tests || die "the build failed"
  "$build/lingtrain" --version | grep -q '^cuda: compiled in' ||
    die "$build/lingtrain has no CUDA backend (configure $build with -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)"
  commit=$(git_commit) || die "no git here to name the commit"
  echo "$commit" >"$(commit_file_of "$build/lingtrain")"
  # The shared libraries the binaries take from this machine's packages (MPI, Highway, PCRE2 and theirs),
  # which a GPU machine with only CUDA and PyTorch lacks; the C and C++ runtimes and CUDA's own libraries
  # (cuBLAS, cuBLASLt, NCCL) are the GPU machine's.
  libs=$(libs_dir_of "$build/lingtrain")
  rm -rf "$libs" && mkdir -p "$libs" || die "cannot make $libs"
  ldd "$build/lingtrain" "$build/lingtrain_tests" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda|/libcuda\.so' |
    while read -r lib; do cp -L "$lib" "$libs/"; done
  echo "gpu_check: $build/lingtrain and $build/lingtrain_tests built at $commit;" \
    "$(ls "$libs" | wc -l) libraries in $libs"
  exit 0
fi
[ $# -eq 0 ] || die "usage: OUT=DIR scripts/gpu_check.sh, or scripts/gpu_check.sh --prepare (see the top of $0)"

read -r -a dtypes <<<"${DTYPES:-f32 tf32 bf16}"
shape=${SHAPE:-}
peer_python=${PEER_PYTHON:-python3}
read -r -a profile <<<"${PROFILE:-moe-m bf16}"
profile_kernels=${PROFILE_KERNELS:-4000}
# The tests of the files that lingtrain_emulated_gpu_tests also builds (tests/cuda/test_cuda.cpp,
# tests/trainer/test_trainer_gpu.cpp, tests/dist/test_route_by_device.cpp); tests/cli/gpu_check_test.sh
# checks that this filter still selects all of them.
gpu_tests=${GPU_TESTS:-CudaBuild.*:CudaCases.*:*CudaMatchesCpu.*:CudaDevice.*:RouteByDevice.*:Trainer.*Gpu*:Trainer.Bf16*}
total_s=${TOTAL_S:-450}
part_s=${PART_S:-120}
tests_s=${TESTS_S:-120}
same_bits_steps=${SAME_BITS_STEPS:-20}
[[ $same_bits_steps =~ ^[0-9]+$ ]] || die "SAME_BITS_STEPS must be a count (0 skips that part), got '$same_bits_steps'"
for n in total_s part_s tests_s profile_kernels; do [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "${n^^} must be a positive integer, got '${!n}'"; done
[[ -z $shape || $shape =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] || die "SHAPE must be BxT (e.g. 1x32), got '$shape'"
[ -x "$lingtrain" ] || die "no lingtrain at $lingtrain (build it first: scripts/gpu_check.sh --prepare)"
# The libraries --prepare collected beside the binaries: the builds the binaries were linked against.
libs=$(libs_dir_of "$lingtrain")
[ -d "$libs" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libs
[ ${#profile[@]} -eq 2 ] || [ "${profile[*]}" = none ] || die "PROFILE must be 'CONFIG DTYPE' or none, got '${PROFILE:-}'"
command -v python3 >/dev/null || die "needs python3 for its report"
mkdir -p "$out" || die "cannot make $out"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || die "cannot make a work folder"

started=$(date +%s)
deadline=$((started + total_s))
reserve_s=15  # for the last report and the logs' archive
min_part_s=20

# ---- The record: one line per part in parts.tsv; report() turns it into gpu_check.json and .md ----

printf 'kind\tconfig\tvariant\tstatus\tseconds\tlimit_s\tstem\n' >"$work/parts.tsv"
# KIND CONFIG VARIANT STATUS SECONDS LIMIT STEM
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$work/parts.tsv"; }

# The line that says why STEM failed: the last error line of its output, else its last line.
error_line() {
  local line
  line=$(cat "$work/$1.err" "$work/$1.out" 2>/dev/null | grep -iE 'error|exception|not found|no such' | tail -n 1)
  [ -n "$line" ] || line=$(cat "$work/$1.out" "$work/$1.err" 2>/dev/null | grep -v '^[[:space:]]*$' | tail -n 1)
  echo "${line:-no output}" | tr '\t' ' ' | cut -c1-200
}

time_left() { echo $((deadline - $(date +%s) - reserve_s)); }

# KIND CONFIG VARIANT CAP_S STEM COMMAND...: runs COMMAND under min(CAP_S, the time left), its stdout
# in STEM.out and stderr in STEM.err. A bench part is ok only when its output ends with a JSON line.
run_part() {
  local kind=$1 config=$2 variant=$3 cap=$4 stem=$5
  shift 5
  local left
  left=$(time_left)
  if ((left < min_part_s)); then
    record "$kind" "$config" "$variant" "skipped: the total budget of ${total_s} s was spent" 0 0 "$stem"
    report
    return 1
  fi
  local limit=$((cap < left ? cap : left)) begin status rc
  echo "gpu_check: $kind $config $variant (at most ${limit} s)" | sed -E 's/( -)+ / /' >&2
  begin=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$work/$stem.out" 2>"$work/$stem.err"
  rc=$?
  if ((rc == 124 || rc == 137)); then
    status="timed out after ${limit} s"
  elif ((rc != 0)); then
    status="failed: $(error_line "$stem")"
  elif [[ $kind == bench || $kind == peer ]] && ! tail -n 1 "$work/$stem.out" | grep -q '^{'; then
    status="failed: no JSON line at the end of its output"
  else
    status=ok
  fi
  record "$kind" "$config" "$variant" "$status" $(($(date +%s) - begin)) "$limit" "$stem"
  report
  [ "$status" = ok ]
}

report() {
  python3 - "$work" "$out" "$started" "$total_s" <<'EOF'
import csv, json, os, sys, time

work, out, started, total_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def read(name):
    path = os.path.join(work, name)
    return open(path, errors="replace").read() if os.path.exists(path) else ""

def last_json(stem):
    lines = read(stem + ".out").strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    except json.JSONDecodeError:
        return None

env = dict(line.split("\t", 1) for line in read("env.tsv").splitlines() if "\t" in line)
parts = list(csv.DictReader(read("parts.tsv").splitlines(), delimiter="\t"))
for part in parts:
    part["seconds"], part["limit_s"] = int(part["seconds"]), int(part["limit_s"])

def tests_summary(part):
    summary = {"status": part["status"], "seconds": part["seconds"], "filter": env.get("gpu_tests", "")}
    try:
        results = json.loads(read("tests.json"))
    except json.JSONDecodeError:
        return summary
    cases = [case for suite in results.get("testsuites", []) for case in suite.get("testsuite", [])]
    failed = [f"{c['classname']}.{c['name']}" for c in cases if c.get("failures")]
    skipped = [c for c in cases if c.get("result") == "SKIPPED" and not c.get("failures")]
    summary.update(tests=len(cases), failed=len(failed), skipped=len(skipped),
                   passed=len(cases) - len(failed) - len(skipped), failed_tests=failed)
    return summary

# Kernels by GPU time from the profiler's CSV: ncu's raw page (a row per launch, then a units row) or
# nsys's kernel summary (a row per kernel name). Columns are found by name: they moved between versions.
def profile_kernels(text, tool):
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "Name" in line and ("Total Time" in line or "gpu__time_duration" in line)), None)
    if start is None:
        return []
    header, *rows = csv.reader(lines[start:])
    def column(*names):
        return next((i for i, h in enumerate(header) for n in names if h.strip().startswith(n)), None)
    kernels = {}
    if tool == "ncu":
        name, time = column("Kernel Name", "Function Name"), column("gpu__time_duration")
        if name is None or time is None:
            return []
        to_ms = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
                 "second": 1e3, "s": 1e3}
        scale = 1e-6
        for row in rows:
            try:
                value = float(row[time].replace(",", ""))
            except (ValueError, IndexError):
                scale = to_ms.get(row[time].strip(), scale) if len(row) > time else scale
                continue
            calls, ms = kernels.get(row[name], (0, 0.0))
            kernels[row[name]] = (calls + 1, ms + value * scale)
    else:
        name, total, calls = column("Name"), column("Total Time"), column("Instances")
        if name is None or total is None or calls is None:
            return []
        for row in rows:
            try:
                kernels[row[name]] = (int(row[calls].replace(",", "")), float(row[total].replace(",", "")) * 1e-6)
            except (ValueError, IndexError):
                continue
    all_ms = sum(ms for _, ms in kernels.values()) or 1.0
    ranked = sorted(kernels.items(), key=lambda item: -item[1][1])
    return [{"kernel": k, "calls": c, "ms": round(ms, 4), "percent": round(100 * ms / all_ms, 1)} for k, (c, ms) in ranked]

result = {
    "gpu": env.get("gpu", ""), "date": env.get("date", ""), "commit": env.get("commit", ""),
    "commit_source": env.get("commit_source", ""), "lingtrain": env.get("lingtrain", ""),
    "lingtrain_version": env.get("lingtrain_version", ""), "host": env.get("host", ""),
    "options": {k[len("option."):]: v for k, v in env.items() if k.startswith("option.")},
    "total_budget_s": total_s, "elapsed_s": int(time.time()) - started,
    "tests": None, "same_bits": None, "bench": [], "peer": [], "profile": None, "parts": parts,
}
for part in parts:
    entry = {"config": part["config"], "status": part["status"], "seconds": part["seconds"]}
    if part["kind"] == "tests":
        result["tests"] = tests_summary(part)
    elif part["kind"] == "same_bits":
        result["same_bits"] = dict(entry, dtype=part["variant"], steps=env.get("same_bits_steps", ""))
    elif part["kind"] == "bench":
        result["bench"].append(dict(entry, dtype=part["variant"], result=last_json(part["stem"])))
    elif part["kind"] == "peer":
        result["peer"].append(dict(entry, mode=part["variant"], result=last_json(part["stem"])))
    elif part["kind"] == "profile":
        tool, _, dtype = part["variant"].partition(" ")
        kernels = profile_kernels(read("profile_kernels.csv"), tool)
        result["profile"] = dict(entry, dtype=dtype, tool=tool, file=env.get("profile_file", ""),
                                 launches=sum(k["calls"] for k in kernels), kernels=kernels[:30])
if result["profile"] is None and "profile_note" in env:
    result["profile"] = {"status": env["profile_note"]}

# The table: lingtrain's rows, then the peer's; MFU against the GPU's bf16 peak that lingtrain's bench
# reads from its table (the peer's FLOPs per token are counted the same way).
peak_gflops = next((b["result"]["peak_gflops"] for b in result["bench"] if b["result"] and b["result"].get("peak_gflops")), 0)
eager = {p["config"]: p["result"]["tokens_per_s"] for p in result["peer"]
         if p["mode"] == "eager" and p["result"] and p["result"].get("tokens_per_s")}

def cell(value, fmt="{:,.0f}"):
    return "–" if value is None else fmt.format(value)

def config_cell(config):  # a config file by its name
    return os.path.basename(config)

def shape_cell(run):
    return f"{run['batch']}x{run['seq']}" if "batch" in run and "seq" in run else "–"

def status_cell(status):
    return status.replace("|", "/")[:120]

lines = [f"# GPU check: {result['gpu'] or 'no GPU found'}", "",
         f"- date {result['date']}, commit `{result['commit']}` ({result['commit_source']}), {result['lingtrain']}",
         f"- {result['lingtrain_version']}"]
tests = result["tests"]
if tests and "tests" in tests:
    failed = ": " + ", ".join(tests["failed_tests"][:10]) if tests["failed"] else ""
    lines.append(f"- GPU tests (`lingtrain_tests`): {tests['passed']} passed, {tests['failed']} failed{failed}, "
                 f"{tests['skipped']} skipped in {tests['seconds']} s ({tests['status']})")
elif tests:
    lines.append(f"- GPU tests: {tests['status']}")
same_bits = result["same_bits"]
if same_bits:
    lines.append(f"- same bits run to run ({same_bits['config']} trained twice, {same_bits['dtype']}, "
                 f"{same_bits['steps']} steps, the weights compared byte for byte): {same_bits['status']}")
profile = result["profile"]
if profile and "tool" in profile:
    top = "; ".join(f"{k['kernel'][:60]} {k['percent']}%" for k in profile["kernels"][:5])
    cap = f" (ncu stops at {result['options'].get('profile_kernels')})" if profile["tool"] == "ncu" else ""
    lines.append(f"- profile of one step, {config_cell(profile['config'])} {profile['dtype']} under {profile['tool']}: "
                 f"{profile['status']}; {profile['file'] or 'no report file'}; {profile['launches']} launches timed{cap}"
                 + (f"; top kernels by GPU time: {top}" if top else ""))
elif profile:
    lines.append(f"- profile: {profile['status']}")
peer_note = env.get("peer_note")
if peer_note:
    lines.append(f"- {peer_note}")
torch_version = next((p["result"].get("torch") for p in result["peer"] if p["result"]), None)
lines += [f"- {result['elapsed_s']} s of the {total_s} s budget", "",
          "| program | config | dtype | B x T | status | tokens/s | step ms | MFU | peak MiB | launches | host syncs | GEMM calls | x peer eager |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for b in result["bench"]:
    r = b["result"] or {}
    d = r.get("device_per_step", {})
    ratio = r["tokens_per_s"] / eager[b["config"]] if "tokens_per_s" in r and b["config"] in eager else None
    lines.append(f"| lingtrain | {config_cell(b['config'])} | {b['dtype']} | {shape_cell(r)} | "
                 f"{status_cell(b['status'])} | {cell(r.get('tokens_per_s'))} | {cell(r.get('step_ms'), '{:.2f}')} | "
                 f"{cell(100 * r['mfu'] if r.get('mfu') else None, '{:.1f}%')} | {cell(r.get('peak_in_use_mb'))} | "
                 f"{cell(d.get('launches'))} | {cell(d.get('host_syncs'), '{:,.1f}')} | {cell(d.get('blas_calls'))} | "
                 f"{cell(ratio, '{:.2f}x')} |")
for p in result["peer"]:
    r = p["result"] or {}
    mfu = 100 * r["achieved_gflops"] / peak_gflops if r.get("achieved_gflops") and peak_gflops else None
    name = f"PyTorch {torch_version}" if torch_version else "PyTorch"
    lines.append(f"| {name} {p['mode']} (SDPA, fused AdamW) | {config_cell(p['config'])} | bf16 autocast | "
                 f"{shape_cell(r)} | {status_cell(p['status'])} | "
                 f"{cell(r.get('tokens_per_s'))} | {cell(r.get('step_ms_median'), '{:.2f}')} | {cell(mfu, '{:.1f}%')} | "
                 f"{cell(r.get('gpu_peak_mem_mb'))} | – | – | – | |")
table = "\n".join(lines) + "\n"

for name, text in (("gpu_check.json", json.dumps(result, indent=1) + "\n"), ("gpu_check.md", table)):
    with open(os.path.join(out, name + ".part"), "w") as f:
        f.write(text)
    os.replace(os.path.join(out, name + ".part"), os.path.join(out, name))
EOF
}

finish() {
  report
  tar -czf "$out/gpu_check_logs.tar.gz" -C "$work" . 2>/dev/null
  rm -rf "$work"
}
trap finish EXIT

# ---- The machine and the commit ----

gpu=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$gpu" ] || gpu="nvidia-smi: not found or no GPU"
commit_file=$(commit_file_of "$lingtrain")
if [ -n "${GIT_COMMIT:-}" ]; then
  commit=$GIT_COMMIT commit_source="GIT_COMMIT"
elif commit=$(git_commit); then
  commit_source="git in $repo"
elif [ -s "$commit_file" ]; then
  commit=$(head -n 1 "$commit_file") commit_source="$commit_file, written by --prepare"
else
  commit=unknown commit_source="no GIT_COMMIT, no git, no $commit_file"
fi
{
  printf 'gpu\t%s\n' "$gpu"
  printf 'date\t%s\n' "$(date -u '+%Y-%m-%d %H:%M UTC')"
  printf 'commit\t%s\n' "$commit"
  printf 'commit_source\t%s\n' "$commit_source"
  printf 'lingtrain\t%s\n' "$lingtrain"
  printf 'lingtrain_version\t%s\n' "$(timeout 60 "$lingtrain" --version 2>&1 | grep -E '^(lingtrain|cuda)' | paste -sd ';' | sed 's/;/; /g')"
  printf 'host\t%s, %s CPUs\n' "$(hostname 2>/dev/null || echo unknown)" "$(nproc)"
  printf 'gpu_tests\t%s\n' "$gpu_tests"
  printf 'option.%s\t%s\n' configs "${configs[*]}" dtypes "${dtypes[*]}" shape "$shape" steps "${STEPS:-}" \
    warmup "${WARMUP:-}" peer "$peer" profile "${profile[*]}" profile_kernels "$profile_kernels" \
    part_s "$part_s" tests_s "$tests_s"
} >"$work/env.tsv"
report

# ---- The parts ----

if [ "$tests_bin" = none ]; then
  record tests - - "skipped: LINGTRAIN_TESTS=none" 0 0 tests
elif [ -x "$tests_bin" ]; then
  run_part tests - - "$tests_s" tests "$tests_bin" --gtest_filter="$gpu_tests" --gtest_output=json:"$work/tests.json"
else
  record tests - - "skipped: no test binary at $tests_bin" 0 0 tests
fi

# Same bits run to run: the tiny model trained twice on the GPU in bf16, the two checkpoints' weights
# compared byte for byte (the kernels keep a fixed order of sums: no floating-point atomics).
printf 'same_bits_steps\t%s\n' "$same_bits_steps" >>"$work/env.tsv"
if ((same_bits_steps == 0)); then
  record same_bits tiny bf16 "skipped: SAME_BITS_STEPS=0" 0 0 same_bits
else
  run_part same_bits tiny bf16 "$part_s" same_bits bash -c '
  mkdir -p "$3" && cd "$3" || exit 1
  for i in $(seq 1 300); do echo "line $i: the quick brown fox $((i * 7 % 13)) jumps over $((i % 5)) dogs."; done \
    >text.txt
  head -n 3 text.txt >val.txt  # a held-out set of a few windows: the run ends with a pass over all of it
  "$1" shards --out data/train text.txt >/dev/null && "$1" shards --out data/val val.txt >/dev/null || exit 1
  for run in a b; do
    "$1" pretrain --model tiny --device cuda --dtype bf16 --steps "$2" --batch 2 --seq 32 --eval-every 0 \
      --ckpt-every 0 --sample-prompt "" --data data/train_000000.bin --val data/val_000000.bin --out $run >/dev/null ||
      exit 1
  done
  cmp -s a/checkpoint/model.safetensors b/checkpoint/model.safetensors ||
    { echo "error: the two runs'"'"' weights differ" >&2; exit 1; }' _ "$lingtrain" "$same_bits_steps" "$work/same_bits"
fi

# CONFIG: the bench flags for its steps and shape.
bench_flags() {
  local steps=10 warmup=3
  [ "$1" = ling-lite-4l ] && steps=3 warmup=1  # 45 GB of f32 state and seconds a step: few steps
  echo "--steps ${STEPS:-$steps} --warmup ${WARMUP:-$warmup}${shape:+ --batch ${shape%x*} --seq ${shape#*x}}"
}
stem_of() { echo "$*" | tr -c 'A-Za-z0-9.\n-' '_'; }

if [ "$peer" = none ]; then
  peer=
  printf 'peer_note\tpeer: skipped (PEER=none)\n' >>"$work/env.tsv"
elif [ ! -f "$peer" ]; then
  printf 'peer_note\tpeer: not found at %s\n' "$peer" >>"$work/env.tsv"
  peer=
elif ! command -v "$peer_python" >/dev/null; then
  printf 'peer_note\tpeer: no %s to run it\n' "$peer_python" >>"$work/env.tsv"
  peer=
fi

# CONFIG MODE: the peer on the GPU in bf16 as a PyTorch user would run the model (through
# scripts/peer_on_device.py, which puts the peer's RoPE tables and mask on the GPU it runs on). Its shape is
# lingtrain's (SHAPE, else the shape of lingtrain's first bench of CONFIG that ran); the peer knows
# moe-s and moe-m by name and reads any other config as a Hugging Face config.json.
run_peer() {
  local config=$1 mode=$2 peer_config=$1 batch="" seq=""
  if [ -n "$shape" ]; then
    batch=${shape%x*} seq=${shape#*x}
  else
    local stem
    stem=$(awk -F'\t' -v c="$config" '$1 == "bench" && $2 == c && $4 == "ok" {print $7; exit}' "$work/parts.tsv")
    [ -n "$stem" ] && read -r batch seq < <(tail -n 1 "$work/$stem.out" |
      python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["batch"], r["seq"])')
  fi
  case $config in
    moe-s | moe-m) ;;
    *) [ -f "$config" ] || peer_config=model/presets/$config.json ;;
  esac
  local args=(bench --config "$peer_config" --device cuda --dtype bf16 --attn sdpa --fused-adamw)
  read -r -a steps <<<"$(bench_flags "$config" | cut -d' ' -f1-4)"
  args+=("${steps[@]}")
  [ -n "$batch" ] && args+=(--batch "$batch" --seq "$seq")
  [ "$mode" = compile ] && args+=(--compile)
  run_part peer "$config" "$mode" "$part_s" "$(stem_of peer "$config" "$mode")" env PYTHONUNBUFFERED=1 "$peer_python" \
    "$repo/scripts/peer_on_device.py" "$peer" "${args[@]}"
}

for config in "${configs[@]}"; do
  read -r -a flags <<<"$(bench_flags "$config")"
  for dtype in "${dtypes[@]}"; do
    run_part bench "$config" "$dtype" "$part_s" "$(stem_of bench "$config" "$dtype")" \
      "$lingtrain" bench --config "$config" --device cuda --dtype "$dtype" "${flags[@]}"
  done
  [ -n "$peer" ] && run_peer "$config" eager
done

# One step (no warm-up: the set-up's few kernels come with it) under nsys, else ncu timing each kernel
# alone (one metric, so one pass; caches and clocks left as they are).
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
if [ "${profile[*]}" = none ]; then
  printf 'profile_note\tskipped (PROFILE=none)\n' >>"$work/env.tsv"
else
  profile_config=${profile[0]} profile_dtype=${profile[1]}
  profiled=("$lingtrain" bench --config "$profile_config" --device cuda --dtype "$profile_dtype" --steps 1 --warmup 0)
  [ -n "$shape" ] && profiled+=(--batch "${shape%x*}" --seq "${shape#*x}")
  export_s() { local left; left=$(time_left); echo $((left < 60 ? (left > 5 ? left : 5) : 60)); }  # the report into CSV
  if command -v nsys >/dev/null; then
    if run_part profile "$profile_config" "nsys $profile_dtype" "$part_s" profile nsys profile --trace=cuda --sample=none \
      --cpuctxsw=none --force-overwrite=true --output="$work/profile" "${profiled[@]}"; then
      for summary in cuda_gpu_kern_sum gpukernsum; do  # the report's name since nsys 2023.1, and before
        timeout "$(export_s)" nsys stats --report "$summary" --format csv "$work/profile.nsys-rep" \
          >"$work/profile_kernels.csv" 2>>"$work/profile.err" && break
      done
      cp "$work/profile.nsys-rep" "$out/gpu_check_profile.nsys-rep" &&
        printf 'profile_file\tgpu_check_profile.nsys-rep\n' >>"$work/env.tsv"
    fi
  elif [ -n "$ncu" ]; then
    if run_part profile "$profile_config" "ncu $profile_dtype" "$part_s" profile "$ncu" --metrics gpu__time_duration.sum \
      --cache-control none --clock-control none --launch-count "$profile_kernels" -f -o "$work/profile" "${profiled[@]}"; then
      timeout "$(export_s)" "$ncu" --import "$work/profile.ncu-rep" --csv --page raw --print-units base \
        --print-kernel-base function >"$work/profile_kernels.csv" 2>>"$work/profile.err"
      cp "$work/profile.ncu-rep" "$out/gpu_check_profile.ncu-rep" &&
        printf 'profile_file\tgpu_check_profile.ncu-rep\n' >>"$work/env.tsv"
    fi
  else
    printf 'profile_note\tskipped: neither nsys nor ncu on this machine\n' >>"$work/env.tsv"
  fi
fi

if [ -n "$peer" ]; then
  for config in "${configs[@]}"; do run_peer "$config" compile; done
fi
echo "gpu_check: $out/gpu_check.md" >&2
