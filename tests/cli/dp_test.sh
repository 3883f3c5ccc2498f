#!/usr/bin/env bash
# Data parallel under mpiexec: N ranks x batch B train like one process with N micro-batches of B (the
# same windows, the same mean gradient; only the summation order of the gradient average differs),
# rank 0 alone reports, and a run resumes bit for bit at the same world size, routing warmup included.
# Usage: dp_test.sh path/to/lingtrain
set -u
bin=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for i in $(seq 1 400); do echo "line $i: the quick brown fox $((i * 7 % 13)) jumps over $((i % 5)) lazy dogs."; done >a.txt
"$bin" shards --out data/train a.txt >/dev/null || fail "shards"
"$bin" shards --out data/val a.txt >/dev/null || fail "shards val"
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 0 --ckpt-every 0 --warmup-steps 2 --steps 6)

# close A B: every lm_loss of metrics files A and B agrees to a relative 1e-5.
close() {
  paste <(grep -o '"lm_loss":[^,]*' "$1" | cut -d: -f2) <(grep -o '"lm_loss":[^,]*' "$2" | cut -d: -f2) |
    awk 'BEGIN { bad = 0; n = 0 } { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) bad++ }
         END { exit (bad > 0 || n != 6) }'
}

for ranks in 2 4; do
  batch=$((4 / ranks))
  "$bin" pretrain "${common[@]}" --routing-warmup 0 --batch $batch --accum $ranks --out one$ranks >/dev/null 2>&1 ||
    fail "one process, $ranks micro-batches"
  mpiexec -n $ranks "$bin" pretrain "${common[@]}" --routing-warmup 0 --batch $batch --out dp$ranks >out$ranks.txt 2>err$ranks.txt ||
    fail "mpiexec -n $ranks"
  close one$ranks/metrics.jsonl dp$ranks/metrics.jsonl || fail "$ranks ranks: losses differ from one process beyond 1e-5"
  grep -q "\"world_size\":$ranks" out$ranks.txt || fail "$ranks ranks: the summary lacks world_size $ranks"
  [ "$(grep -c '^{' out$ranks.txt)" = 1 ] || fail "$ranks ranks: not exactly one summary line"
  [ "$(grep -c '^step 1/6' err$ranks.txt)" = 1 ] || fail "$ranks ranks: progress printed by more than rank 0"
done

# Resume at 2 ranks, through the routing warmup (its statistics are averaged across ranks each step).
mpiexec -n 2 "$bin" pretrain "${common[@]}" --routing-warmup 5 --batch 2 --out full >/dev/null 2>&1 || fail "dp full"
mpiexec -n 2 "$bin" pretrain "${common[@]}" --routing-warmup 5 --batch 2 --out part --stop-at 3 >/dev/null 2>&1 ||
  fail "dp part"
mpiexec -n 2 "$bin" pretrain --resume part/checkpoint --out part --threads 1 --sample-prompt "" --eval-every 0 \
  --ckpt-every 0 >/dev/null 2>&1 || fail "dp resume"
cmp -s full/checkpoint/model.safetensors part/checkpoint/model.safetensors || fail "dp: resumed weights differ"
cmp -s full/checkpoint/optimizer.safetensors part/checkpoint/optimizer.safetensors || fail "dp: resumed optimizer differs"

if [ "$failures" -eq 0 ]; then echo "dp: all checks passed"; else echo "dp: $failures check(s) failed"; exit 1; fi
