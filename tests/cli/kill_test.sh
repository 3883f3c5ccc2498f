#!/usr/bin/env bash
# kill -9 trials: a run that checkpoints every step is killed with SIGKILL at random moments (many of
# them inside a checkpoint write) and resumed, over and over; every resume must find a complete
# checkpoint, and the final weights and optimiser state must equal an uninterrupted run's bit for bit.
# The killed runs write in the background (--ckpt-async on, the default) and keep a history of three, each
# kept checkpoint complete, and a resume from a kept one ends with the same bits too.
# Also a resume on another thread count, which must not change a bit either.
# Also a full disk: the write fails with one clear line and the previous checkpoint stays intact.
# Usage: kill_test.sh path/to/lingtrain [TRIALS]
source "$(dirname "$0")/common.sh"
trials=${2:-24}

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --batch 4 --threads 1
  --sample-prompt "" --eval-every 0 --warmup-steps 2 --steps 400 --ckpt-every 1)
"$bin" pretrain "${common[@]}" --out whole >/dev/null 2>&1 || fail "uninterrupted run"

RANDOM=7  # the same kill moments on every run of the test
killed=0 resumed=0 in_write=0
for trial in $(seq 1 "$trials"); do
  if [ -e killed/checkpoint ] || [ -e killed/checkpoint.old ]; then
    "$bin" pretrain --resume killed/checkpoint --out killed --threads 1 --sample-prompt "" --eval-every 0 \
      --ckpt-every 1 --keep-checkpoints 3 >/dev/null 2>trial.err &
    resumed=$((resumed + 1))
  else
    "$bin" pretrain "${common[@]}" --keep-checkpoints 3 --out killed >/dev/null 2>trial.err &
  fi
  pid=$!
  sleep "0.$((RANDOM % 40 + 5))"
  if kill -9 $pid 2>/dev/null; then killed=$((killed + 1)); fi
  wait $pid 2>/dev/null
  # A staging folder left behind: the kill fell inside a checkpoint write.
  if compgen -G "killed/checkpoint.tmp-*" >/dev/null || [ -e killed/checkpoint.old ]; then in_write=$((in_write + 1)); fi
  grep -q "error" trial.err && fail "trial $trial: $(grep error trial.err | head -1)"
done
"$bin" pretrain --resume killed/checkpoint --out killed --threads 1 --sample-prompt "" --eval-every 0 --ckpt-every 1 \
  --keep-checkpoints 3 >/dev/null 2>final.err || fail "final resume: $(tail -1 final.err)"
[ "$killed" -ge 20 ] || fail "only $killed of $trials runs were killed mid-run (the run is too short for the kill moments)"
for f in model.safetensors optimizer.safetensors; do
  cmp -s whole/checkpoint/$f killed/checkpoint/$f || fail "after $killed kills and $resumed resumes: $f differs"
done
# The metrics log holds each step once: a resume drops the records its checkpoint does not cover (and a
# line torn by the kill, and the end-of-run record of a run it continues) before it redoes those steps.
# A step the spike guard retried has one more record, of the attempt ("update":"retry"), in both logs.
steps=$(grep -v '"heldout":"end"\|"update":"retry"' killed/metrics.jsonl | grep -o '"step":[0-9]*' | cut -d: -f2)
[ "$(grep -c '"heldout":"end"' killed/metrics.jsonl)" = 1 ] || fail "metrics log: not one end-of-run record"
[ "$(echo "$steps" | sort -n | uniq | wc -l)" = 400 ] && [ "$(echo "$steps" | wc -l)" = 400 ] ||
  fail "metrics log: $(echo "$steps" | wc -l) records for $(echo "$steps" | sort -n | uniq | wc -l) distinct steps, want 400 and 400"
records() { grep -o '"lm_loss":[^,]*\|"step":[0-9]*\|"update":"[a-z]*"' "$1" | tr '\n' ' '; }
[ "$(records whole/metrics.jsonl)" = "$(records killed/metrics.jsonl)" ] ||
  fail "metrics log: the killed and resumed run's records differ from the uninterrupted run's"
[ "$(grep -vc '^{.*}$' killed/metrics.jsonl)" = 0 ] || fail "metrics log: a malformed line"
echo "kill -9 trials: $killed kills ($in_write inside a checkpoint write), $resumed resumes, final weights identical"
kept=(killed/checkpoints/step-*)
[ "${#kept[@]}" = 2 ] || fail "history: ${#kept[@]} kept checkpoints besides the latest, want 2"
for k in "${kept[@]}"; do
  "$bin" eval --ckpt "$k" --data data/val_000000.bin >/dev/null 2>&1 || fail "history: $k unreadable"
done
"$bin" pretrain --resume "${kept[0]}" --out from_kept --threads 1 --sample-prompt "" --eval-every 0 --ckpt-every 0 \
  >/dev/null 2>&1 || fail "resume from ${kept[0]}"
for f in model.safetensors optimizer.safetensors; do
  cmp -s whole/checkpoint/$f from_kept/checkpoint/$f || fail "resumed from ${kept[0]}: $f differs"
done

# Another core count: a run stopped half-way with 2 threads and resumed with 1 ends with the bits of an
# uninterrupted 1-thread run. 512 rows per step, so the row reductions split into several chunks.
cores=(--model tiny --data data/train_000000.bin --seq 64 --batch 8 --sample-prompt "" --eval-every 0 --warmup-steps 2
  --steps 60)
"$bin" pretrain "${cores[@]}" --threads 1 --out one_thread >/dev/null 2>&1 || fail "1-thread run"
"$bin" pretrain "${cores[@]}" --threads 2 --stop-at 30 --out two_threads >/dev/null 2>&1 || fail "2-thread run"
"$bin" pretrain --resume two_threads/checkpoint --threads 1 --sample-prompt "" --eval-every 0 >/dev/null 2>&1 ||
  fail "1-thread resume of a 2-thread run"
for f in model.safetensors optimizer.safetensors; do
  cmp -s one_thread/checkpoint/$f two_threads/checkpoint/$f || fail "2 threads then 1: $f differs from a 1-thread run"
done

# A full disk: a small tmpfs would need mount privileges; a file-size limit (ulimit -f, with SIGXFSZ
# ignored) makes the write fail the same way (EFBIG instead of ENOSPC) without them.
"$bin" pretrain "${common[@]}" --steps 4 --out full >/dev/null 2>&1 || fail "small run"
cp full/checkpoint/model.safetensors before.safetensors
(trap '' XFSZ; ulimit -f 1024; "$bin" pretrain --resume full/checkpoint --out full --steps 8 --threads 1 --sample-prompt "" \
  --eval-every 0 --ckpt-every 1 >/dev/null 2>disk.err) && fail "a checkpoint larger than the file-size limit was written"
[ "$(grep -c . disk.err)" -ge 1 ] && tail -1 disk.err | grep -q "error: .*full/checkpoint" ||
  fail "full disk: no clear line naming the checkpoint ($(tail -1 disk.err))"
cmp -s before.safetensors full/checkpoint/model.safetensors || fail "full disk: the previous checkpoint changed"
"$bin" eval --ckpt full/checkpoint --data data/val_000000.bin >/dev/null 2>&1 || fail "full disk: previous checkpoint unreadable"

finish kill
