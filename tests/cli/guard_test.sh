#!/usr/bin/env bash
# The spike guard and NaN recovery from the command line, with faults injected by the test-only
# --inject switch: a spike is retried on the next batch and the run ends where a clean one does; NaN
# steps never reach the weights, and after K in a row the run reloads its last checkpoint and finishes;
# recovery that fails again before the next checkpoint goes back to the kept one before it; a run that keeps
# diverging (--lr 1e3) stops with one clear line and leaves a finite checkpoint; the
# guard's state survives a resume bit for bit; ranks under mpiexec decide together.
# Usage: guard_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

# Loss comparisons need a run whose end does not hinge on the order of a few batches: the embedded
# corpus (seeds change its held-out loss by ~0.01%), made once by a one-step run.
"$bin" pretrain --model tiny --steps 1 --threads 1 --sample-prompt "" --out corpus >/dev/null 2>&1 || fail "corpus"
big=(--model tiny --data corpus/data/train.bin --val corpus/data/val.bin --seq 64 --batch 8 --threads 1
  --sample-prompt "" --eval-every 0 --warmup-steps 10 --steps 200 --ckpt-every 50)
val() { grep -o '"val_loss":[^,}]*' "$1" | cut -d: -f2; }
within() { awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= r * b) }'; }

"$bin" pretrain "${big[@]}" --out clean >clean.txt 2>clean.err || fail "clean run: $(tail -1 clean.err)"
grep -q '"spike"' clean/metrics.jsonl && fail "clean run: the guard saw a spike: $(grep -o '"spike":{[^}]*}' clean/metrics.jsonl | head -2)"

# A spike 30x at step 120: retried on the next batch, so the held-out loss ends within 2% of the clean run's.
"$bin" pretrain "${big[@]}" --inject spike@120:30 --out spike >spike.txt 2>spike.err || fail "spike run: $(tail -1 spike.err)"
grep -q '"spike":{"action":"retry","kind":"loss","z":[^}]*},"step":120,' spike/metrics.jsonl ||
  fail "spike: no retry of step 120 in the metrics: $(grep -o '"spike":{[^}]*}' spike/metrics.jsonl | head -2)"
grep -q 'loss spike (z [0-9.]*): retry' spike.err || fail "spike: not on the progress lines"
within "$(val spike.txt)" "$(val clean.txt)" 0.02 || fail "spike: held-out $(val spike.txt) vs clean $(val clean.txt), beyond 2%"
[ "$(grep -o '"steps":[0-9]*' spike.txt)" = '"steps":200' ] || fail "spike: the run did not take its 200 steps"

# Five NaN attempts at step 100: three in a row reload the checkpoint of step 100 (the rate halved for
# good), two more are retried.
"$bin" pretrain "${big[@]}" --inject nan@100:5 --out nan >nan.txt 2>nan.err || fail "nan run: $(tail -1 nan.err)"
[ "$(grep -c '"action":"reload"' nan/metrics.jsonl)" = 1 ] || fail "nan: not exactly one reload"
grep -q 'non-finite steps in a row; reloaded .*, learning rate now x0.5' nan.err || fail "nan: no reload line"
[ "$(grep -o '"steps":[0-9]*' nan.txt)" = '"steps":200' ] || fail "nan: the run did not finish its 200 steps"
"$bin" eval --ckpt nan/checkpoint --data corpus/data/val.bin >/dev/null 2>&1 || fail "nan: checkpoint does not evaluate"
# The halved rate costs loss (~3% here); without the cut the recovered run ends where a clean one does.
"$bin" pretrain "${big[@]}" --inject nan@100:3 --spike-lr-cut 1 --out nan1 >nan1.txt 2>/dev/null || fail "nan run, no cut"
within "$(val nan1.txt)" "$(val clean.txt)" 0.02 || fail "nan: held-out $(val nan1.txt) vs clean $(val clean.txt), beyond 2%"

# The rest on a small text corpus: quicker, and no loss comparisons.
make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --batch 4 --threads 1
  --sample-prompt "" --eval-every 0 --warmup-steps 5 --steps 120 --ckpt-every 20)

# A learning rate that always diverges: reloads at ever lower rates, then one clear line and exit 1; the
# checkpoint on disk stays finite.
"$bin" pretrain "${common[@]}" --lr 1e3 --max-reloads 2 --out diverge >/dev/null 2>diverge.err && fail "--lr 1e3 exited 0"
tail -1 diverge.err | grep -q "error: the run diverged" || fail "--lr 1e3: last line '$(tail -1 diverge.err)'"
"$bin" eval --ckpt diverge/checkpoint --data data/val_000000.bin >/dev/null 2>&1 || fail "--lr 1e3: checkpoint not finite"

# Recovery that fails at the latest checkpoint goes back one further: six NaN attempts at step 100 reload
# the checkpoint of step 100 after three, then the kept one of step 80 (--keep-checkpoints 2) after three more.
"$bin" pretrain "${common[@]}" --keep-checkpoints 2 --inject nan@100:6 --out fallback >/dev/null 2>fallback.err ||
  fail "fallback run: $(tail -1 fallback.err)"
grep -q 'non-finite steps in a row; reloaded fallback/checkpoint,' fallback.err || fail "fallback: no reload of the latest"
grep -q 'non-finite steps in a row; reloaded fallback/checkpoints/step-00000080,' fallback.err ||
  fail "fallback: the second reload did not go back to step 80: $(grep reloaded fallback.err)"
[ "$(ls fallback/checkpoints)" = "step-00000100" ] || fail "fallback: history $(ls fallback/checkpoints), want step 100's"
"$bin" eval --ckpt fallback/checkpoint --data data/val_000000.bin >/dev/null 2>&1 || fail "fallback: checkpoint unreadable"

# Resume through the guard's state: stop at 90 (after the spike at 80), resume, equal weights.
"$bin" pretrain "${common[@]}" --inject spike@80:30 --out spike80 >/dev/null 2>&1 || fail "spike run, small corpus"
"$bin" pretrain "${common[@]}" --inject spike@80:30 --stop-at 90 --out part >/dev/null 2>&1 || fail "stopped spike run"
"$bin" pretrain --resume part/checkpoint --out part --threads 1 --sample-prompt "" --eval-every 0 --ckpt-every 20 \
  >/dev/null 2>&1 || fail "resume after a spike"
cmp -s spike80/checkpoint/model.safetensors part/checkpoint/model.safetensors || fail "resume after a spike: weights differ"

# Two ranks decide together (the loss is averaged before the guard judges it).
mpiexec -n 2 "$bin" pretrain "${common[@]}" --batch 2 --inject nan@60:4 --out nan2 >nan2.txt 2>nan2.err ||
  fail "nan under mpiexec: $(tail -1 nan2.err)"
[ "$(grep -c '"action":"reload"' nan2/metrics.jsonl)" = 1 ] || fail "nan under mpiexec: not exactly one reload"

finish guard
