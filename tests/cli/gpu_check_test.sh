#!/usr/bin/env bash
# scripts/gpu_check.sh's whole flow without a GPU, against the emulated GPU (lingtrain_emulated_gpu) on
# the tiny preset at 1 x 16 tokens: the GPU tests (they skip), bench in f32, tf32 and bf16 (a dtype the
# binary rejects is recorded as failed, not fatal), a stand-in for the PyTorch peer (its flags checked;
# eager ok, --compile failing), the profile (skipped without nsys and ncu), gpu_check.json and
# gpu_check.md with their keys and rows; then a part that times out and one the total budget skips;
# and that the script's test filter selects every test lingtrain_emulated_gpu_tests holds from the
# same files. About 30 s. Skipped (77) without python3, which the script's report needs.
# Usage: gpu_check_test.sh path/to/lingtrain_emulated_gpu path/to/lingtrain_tests path/to/lingtrain_emulated_gpu_tests
command -v python3 >/dev/null || { echo "gpu_check_test: no python3: skipped"; exit 77; }
script=$(realpath "$(dirname "$0")/../../scripts/gpu_check.sh")
config=$(realpath "$(dirname "$0")/../../bench/moe-m-structure.json")
tests_bin=$(realpath "$2")
emulated_tests=$(realpath "$3")
source "$(dirname "$0")/common.sh"

cat >peer.py <<'EOF'
import json, sys
args = sys.argv[1:]
expected = {"--device": "cuda", "--dtype": "bf16", "--attn": "sdpa", "--config": "model/presets/tiny.json",
            "--batch": "1", "--seq": "16", "--steps": "1", "--warmup": "0"}
wrong = [f for f, v in expected.items() if f not in args or args.index(f) + 1 == len(args) or args[args.index(f) + 1] != v]
if args[0] != "bench" or "--fused-adamw" not in args or wrong:
    sys.exit(f"error: the peer was not given {wrong or 'bench --fused-adamw'}: {args}")
if "--compile" in args:
    sys.exit("RuntimeError: no torch.compile in this stand-in")
print(json.dumps({"config": "tiny", "batch": 1, "seq": 16, "tokens_per_s": 1000.0, "step_ms_median": 16.0,
                  "achieved_gflops": 5.0, "gpu_peak_mem_mb": 12.5, "torch": "stand-in"}))
EOF

OUT=out LINGTRAIN=$bin LINGTRAIN_TESTS=$tests_bin CONFIGS=tiny SHAPE=1x16 STEPS=1 WARMUP=0 PEER=peer.py \
  PROFILE="tiny f32" SAME_BITS_STEPS=1 GIT_COMMIT=c0ffee "$script" >log.txt 2>&1 ||
  fail "gpu_check.sh exited non-zero: $(tail -5 log.txt)"
for file in gpu_check.json gpu_check.md gpu_check_logs.tar.gz; do [ -s "out/$file" ] || fail "no out/$file"; done
python3 - out/gpu_check.json <<'EOF' || fail "gpu_check.json: see above"
import json, sys
r = json.load(open(sys.argv[1]))
errors = []
def check(ok, what):
    if not ok:
        errors.append(what)
for key in ("gpu", "date", "commit", "commit_source", "lingtrain_version", "options", "tests", "bench", "peer", "profile", "parts"):
    check(key in r, f"no key {key}")
check(r["commit"] == "c0ffee", f"commit {r['commit']!r}, not GIT_COMMIT's")
check(r["tests"]["tests"] > 0 and r["tests"]["failed"] == 0, f"tests: {r['tests']}")
check([b["dtype"] for b in r["bench"]] == ["f32", "tf32", "bf16"], f"bench dtypes: {[b['dtype'] for b in r['bench']]}")
for b in r["bench"]:
    if b["dtype"] != "tf32" or b["status"] == "ok":
        check(b["status"] == "ok" and b["result"]["device_per_step"]["launches"] > 0, f"bench {b['dtype']}: {b['status']}")
    else:
        check(b["status"].startswith("failed: ") and "tf32" in b["status"], f"bench tf32: {b['status']}")
peer = {p["mode"]: p for p in r["peer"]}
check(peer.get("eager", {}).get("status") == "ok" and peer["eager"]["result"]["tokens_per_s"] == 1000.0, f"peer eager: {peer.get('eager')}")
check(peer.get("compile", {}).get("status", "").startswith("failed: RuntimeError"), f"peer compile: {peer.get('compile')}")
check(isinstance(r["profile"], dict) and "status" in r["profile"], f"profile: {r['profile']}")
for e in errors:
    print("gpu_check.json:", e)
sys.exit(1 if errors else 0)
EOF
md=out/gpu_check.md
grep -q '^| program | config | dtype | B x T | status | tokens/s | step ms | MFU | peak MiB | launches | host syncs | GEMM calls |' $md ||
  fail "no table header in $md: $(cat $md)"
for row in '| lingtrain | tiny | f32 | 1x16 | ok |' '| lingtrain | tiny | bf16 | 1x16 | ok |' '| lingtrain | tiny | tf32 |' \
  'eager (SDPA, fused AdamW) | tiny | bf16 autocast | 1x16 | ok | 1,000 |' '| failed: RuntimeError: no torch.compile'; do
  grep -qF -- "$row" $md || fail "no row '$row' in $md: $(cat $md)"
done
grep -q '^- GPU tests (`lingtrain_tests`): [0-9]* passed, 0 failed' $md || fail "no tests line in $md"
grep -q '^- profile' $md || fail "no profile line in $md"
grep -q '^- same bits run to run (tiny trained twice, bf16, 1 steps, .*): ok$' $md || fail "no same-bits line in $md"

# A part that outlives PART_S is recorded and the script goes on; once less than a part's minimum is
# left of TOTAL_S, the rest is recorded as skipped.
OUT=budget LINGTRAIN=$bin LINGTRAIN_TESTS=none CONFIGS=$config DTYPES="f32 bf16" SHAPE=1x32 STEPS=1 WARMUP=1 PEER=none \
  PROFILE=none SAME_BITS_STEPS=0 PART_S=8 TOTAL_S=40 "$script" >budget.txt 2>&1 ||
  fail "gpu_check.sh exited non-zero: $(tail -5 budget.txt)"
grep -qF '| lingtrain | moe-m-structure.json | f32 | – | timed out after 8 s |' budget/gpu_check.md ||
  fail "no timed-out row: $(cat budget/gpu_check.md)"
grep -qF '| lingtrain | moe-m-structure.json | bf16 | – | skipped: the total budget of 40 s was spent |' budget/gpu_check.md ||
  fail "no skipped row: $(cat budget/gpu_check.md)"
grep -q 'peer: skipped (PEER=none)' budget/gpu_check.md || fail "no peer line: $(cat budget/gpu_check.md)"

# The filter selects, among lingtrain_tests, every test of the GPU test files that
# lingtrain_emulated_gpu_tests holds (all of it but the device counters' ceilings).
names() { awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}' | sort; }
filter=$(sed -n 's/^gpu_tests=\${GPU_TESTS:-\(.*\)}$/\1/p' "$script")
[ -n "$filter" ] || fail "no default GPU_TESTS in $script"
"$emulated_tests" --gtest_list_tests --gtest_filter='-DeviceCounters*' | names >emulated.txt
"$tests_bin" --gtest_list_tests --gtest_filter="$filter" | names >selected.txt
[ -s emulated.txt ] || fail "no tests listed by $emulated_tests"
missed=$(comm -23 emulated.txt selected.txt)
[ -z "$missed" ] || fail "GPU_TESTS in gpu_check.sh misses: $missed"

finish gpu_check
