#!/usr/bin/env bash
# --dtype bf16 on the CPU against f32, on the tiny model and the embedded corpus (the run `make train`
# does, 200 steps of it). On a CPU with AVX512_BF16 the matmuls take bf16 operands: the loss curve
# (means over 25-step windows) and the held-out loss stay within 1% of f32's without being f32's. On
# other CPUs (`lingtrain --version` says which) the run says its matmuls stay f32 and trains exactly as
# f32 does; where bf16 runs, its bits do not depend on the thread count and a resumed run ends as an
# uninterrupted one. CTest runs it twice: as the machine is, and with the kernels capped at AVX2
# (LINGTRAIN_CPU_TARGET), which has no bf16 GEMM, so the fallback is checked on every x86 machine (there
# in fewer steps: it compares checkpoints, not curves).
# Usage: bf16_test.sh path/to/lingtrain [steps (200)]
source "$(dirname "$0")/common.sh"
steps=${2:-200}
if [ -n "${LINGTRAIN_CPU_TARGET:-}" ]; then
  "$bin" --version | grep -qi "Highway $LINGTRAIN_CPU_TARGET," || fail "LINGTRAIN_CPU_TARGET=$LINGTRAIN_CPU_TARGET is not the target --version reports"
fi

# LINGTRAIN_CPU_AMX: 0 keeps a Xeon's AMX tiles off (the VDPBF16PS kernel then), anything but 0 or 1 is one
# error line.
if "$bin" --version | grep -q "bf16 GEMM (AMX tiles)"; then
  LINGTRAIN_CPU_AMX=0 "$bin" --version | grep -q "bf16 GEMM (AVX512_BF16)" || fail "LINGTRAIN_CPU_AMX=0 still uses the tiles"
fi
expect_error "LINGTRAIN_CPU_AMX=yes" "LINGTRAIN_CPU_AMX=yes must be 0" env LINGTRAIN_CPU_AMX=yes "$bin" --version

flags=(--model tiny --steps "$steps" --threads 2 --sample-prompt "")
"$bin" pretrain "${flags[@]}" --out f32 >f32.txt 2>&1 || fail "pretrain f32: $(tail -1 f32.txt)"
"$bin" pretrain "${flags[@]}" --data f32/data/train.bin --val f32/data/val.bin --out bf16 --dtype bf16 >bf16.txt 2>&1 ||
  fail "pretrain bf16: $(tail -1 bf16.txt)"

losses() { grep -o '"loss":[^,]*' "$1" | cut -d: -f2; }
held_out() { grep 'held-out loss (all of' "$1" | sed 's/.*: //'; }
if "$bin" --version | grep -q ", bf16 GEMM ("; then
  grep -q "; bf16 matmuls" bf16.txt || fail "a CPU with AVX512_BF16: the bf16 run does not say it multiplies in bf16"
  paste <(losses f32/metrics.jsonl) <(losses bf16/metrics.jsonl) |
    awk -v steps="$steps" '{ w = int((NR - 1) / 25); f[w] += $1; b[w] += $2; if ($1 != $2) differ++ }
         END { for (w in f) { d = (b[w] - f[w]) / f[w]; if (d < 0) d = -d; if (d > 0.01) far++;
                              printf "steps %d-%d: f32 %.4f bf16 %.4f\n", 25 * w + 1, 25 * w + 25, f[w] / 25, b[w] / 25 }
               exit !(NR == steps && far == 0 && differ > 0) }' ||
    fail "the bf16 loss curve is not within 1% of f32's (or is f32's)"
  awk -v f="$(held_out f32.txt)" -v b="$(held_out bf16.txt)" \
    'BEGIN { print "held-out: f32 " f ", bf16 " b; d = (b - f) / f; exit !(f > 0 && d < 0.01 && d > -0.01) }' ||
    fail "the bf16 held-out loss is not within 1% of f32's"
  # The bf16 products keep f32's rules: the same bits on 1 and 2 threads, and a run stopped and resumed
  # ends as the uninterrupted one does (two 64-row attention blocks per sequence, so the causal walks run).
  short=(--model tiny --data f32/data/train.bin --val f32/data/val.bin --batch 2 --seq 128 --sample-prompt ""
    --eval-every 0 --routing-warmup 3 --warmup-steps 2 --dtype bf16)
  "$bin" pretrain "${short[@]}" --steps 6 --threads 1 --out one >/dev/null 2>&1 || fail "bf16 on 1 thread"
  "$bin" pretrain "${short[@]}" --steps 6 --threads 2 --out two >/dev/null 2>&1 || fail "bf16 on 2 threads"
  cmp -s one/checkpoint/model.safetensors two/checkpoint/model.safetensors || fail "bf16: 1 and 2 threads differ"
  "$bin" pretrain "${short[@]}" --steps 3 --threads 2 --out part >/dev/null 2>&1 || fail "bf16: 3 steps"
  "$bin" pretrain --out part --steps 6 --resume part/checkpoint --dtype bf16 --threads 2 >/dev/null 2>&1 ||
    fail "bf16: resume"
  cmp -s two/checkpoint/model.safetensors part/checkpoint/model.safetensors || fail "bf16: resumed weights differ"
  cmp -s two/checkpoint/optimizer.safetensors part/checkpoint/optimizer.safetensors ||
    fail "bf16: resumed optimizer differs"
else
  grep -q "no AVX512_BF16, so the matmuls stay f32" bf16.txt || fail "bf16 on a CPU without AVX512_BF16: no notice"
  cmp -s f32/checkpoint/model.safetensors bf16/checkpoint/model.safetensors || fail "the f32 fallback trained differently"
fi

finish bf16
