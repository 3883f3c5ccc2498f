#!/usr/bin/env bash
# Data parallel under mpiexec: N ranks x batch B train like one process with N micro-batches of B (the
# same windows, the same mean gradient, the routing warmup's noise and statistics alike; only the
# summation order of the gradient average differs),
# rank 0 alone reports, a run resumes bit for bit at the same world size, routing warmup included (also
# on machines that share no folder: rank 0 sends the checkpoint), and
# faults end the whole run promptly: mismatched settings, an error on one rank, a killed rank, a rank that
# stops answering (the hang watchdog).
# Usage: dp_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 0 --ckpt-every 0 --warmup-steps 2 --steps 6)

for ranks in 2 4; do
  batch=$((4 / ranks))
  # The routing warmup (4 of the 6 steps) runs in both.
  "$bin" pretrain "${common[@]}" --routing-warmup 4 --batch $batch --accum $ranks --out one$ranks >/dev/null 2>&1 ||
    fail "one process, $ranks micro-batches"
  mpiexec -n $ranks "$bin" pretrain "${common[@]}" --routing-warmup 4 --batch $batch --out dp$ranks >out$ranks.txt \
    2>err$ranks.txt || fail "mpiexec -n $ranks"
  close one$ranks/metrics.jsonl dp$ranks/metrics.jsonl || fail "$ranks ranks: losses differ from one process beyond 1e-5"
  close one$ranks/metrics.jsonl dp$ranks/metrics.jsonl grad_norm ||
    fail "$ranks ranks: gradient norms differ from one process beyond 1e-5"
  # The largest router logit of a step is the largest of any rank's (each MoE layer of the tiny model: 3 per step).
  close one$ranks/metrics.jsonl dp$ranks/metrics.jsonl max_logit 18 ||
    fail "$ranks ranks: max_logit differs from one process: $(grep -o '"max_logit":[^,]*' dp$ranks/metrics.jsonl | head -3)"
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
# The gradient average begun during the backward (the default) has the bits of the average after it, with
# gradient accumulation too (only the last micro-batch's backward overlaps).
mpiexec -n 2 "$bin" pretrain "${common[@]}" --routing-warmup 5 --batch 2 --overlap-grads 0 --out after \
  >/dev/null 2>&1 || fail "dp --overlap-grads 0"
cmp -s full/checkpoint/model.safetensors after/checkpoint/model.safetensors ||
  fail "dp: the average overlapping the backward differs from the average after it"
for overlap in 0 1; do
  mpiexec -n 4 "$bin" pretrain "${common[@]}" --batch 1 --accum 2 --overlap-grads $overlap --out accum$overlap \
    >/dev/null 2>&1 || fail "dp --accum 2 --overlap-grads $overlap"
done
cmp -s accum0/checkpoint/model.safetensors accum1/checkpoint/model.safetensors ||
  fail "dp --accum 2: the average overlapping the last backward differs from the average after it"
"$bin" pretrain "${common[@]}" --batch 2 --overlap-grads 2 --out badoverlap >/dev/null 2>bo.err &&
  fail "--overlap-grads 2 accepted"
grep -q "overlap-grads must be 0 or 1" bo.err || fail "--overlap-grads: no clear line ($(head -1 bo.err))"

# Faults. Ranks started with different settings refuse to start.
mpiexec -n 1 "$bin" pretrain "${common[@]}" --batch 2 --out mm : -n 1 "$bin" pretrain "${common[@]}" --batch 2 --steps 7 \
  --out mm >/dev/null 2>mm.err && fail "ranks with different flags started"
grep -q "other settings" mm.err || fail "mismatched ranks: no clear line ($(head -1 mm.err))"
# An error on one rank (rank 0 cannot create --out) ends the others, which wait in a collective.
echo file >notadir
timeout 60 mpiexec -n 2 "$bin" pretrain "${common[@]}" --batch 2 --out notadir >/dev/null 2>nd.err
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "an erroring rank: mpiexec exited $rc (124: the other rank hung)"
grep -q "error: rank 0: .*notadir" nd.err || fail "an erroring rank: no line naming the rank ($(head -1 nd.err))"
# An error before the world is joined (a flag rank 1 cannot read) ends rank 0 too, which waits to join it.
timeout 60 mpiexec -n 1 "$bin" pretrain "${common[@]}" --batch 2 --out early : \
  -n 1 "$bin" pretrain "${common[@]}" --batch 2 --steps abc --out early >/dev/null 2>early.err
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "an error before joining the world: mpiexec exited $rc (124: rank 0 hung)"
grep -q "error: rank 1: flag --steps needs an integer" early.err ||
  fail "an error before joining the world: no line naming the rank ($(head -1 early.err))"
# Machines that share no filesystem: a folder of its own per rank (-wdir), each with its copy of the data.
# Rank 0 alone holds the checkpoint and sends it to the others: the resume ends with the bits of the
# uninterrupted run, under dp and under EDiT (whose ranks each read their own state), and a diverged run
# goes back to its checkpoints the same way. A fresh run on the embedded corpus makes it on every machine.
mkdir -p own0 own1 && cp -r data own0/ && cp -r data own1/ && cp -r part own0/
resume=(pretrain --resume part/checkpoint --threads 1 --sample-prompt "" --eval-every 0 --ckpt-every 0)
mpiexec -n 1 -wdir own0 "$bin" "${resume[@]}" : -n 1 -wdir own1 "$bin" "${resume[@]}" >/dev/null 2>own.err ||
  fail "resume without a shared folder: $(tail -1 own.err)"
cmp -s full/checkpoint/model.safetensors own0/part/checkpoint/model.safetensors ||
  fail "resume without a shared folder: weights differ from the uninterrupted run"
[ "$(ls own1)" = data ] || fail "resume without a shared folder: rank 1 left files: $(ls own1)"
edit=(--batch 2 --steps 12 --dist edit --sync-interval 2 --local-sgd-warmup 2)
mpiexec -n 2 "$bin" pretrain "${common[@]}" "${edit[@]}" --out efull >/dev/null 2>&1 || fail "edit run"
mpiexec -n 2 "$bin" pretrain "${common[@]}" "${edit[@]}" --stop-at 7 --out own0/epart >/dev/null 2>&1 || fail "edit part"
mpiexec -n 1 -wdir own0 "$bin" "${resume[@]/part/epart}" : -n 1 -wdir own1 "$bin" "${resume[@]/part/epart}" \
  >/dev/null 2>own.err || fail "edit resume without a shared folder: $(tail -1 own.err)"
for f in model.safetensors edit/rank-00001.safetensors; do
  cmp -s efull/checkpoint/$f own0/epart/checkpoint/$f || fail "edit resume without a shared folder: $f differs"
done
nan=(pretrain "${common[@]}" --batch 2 --steps 12 --ckpt-every 4 --keep-checkpoints 2 --inject nan@8:6 --out nan)
mpiexec -n 1 -wdir own0 "$bin" "${nan[@]}" : -n 1 -wdir own1 "$bin" "${nan[@]}" >/dev/null 2>own.err ||
  fail "reloads without a shared folder: $(tail -1 own.err)"
grep -q "reloaded nan/checkpoints/step-00000004," own.err || fail "reloads without a shared folder: no reload of step 4"
embedded=(pretrain --model tiny --steps 2 --threads 1 --sample-prompt "" --eval-every 0 --out emb)
mpiexec -n 1 -wdir own0 "$bin" "${embedded[@]}" : -n 1 -wdir own1 "$bin" "${embedded[@]}" >/dev/null 2>own.err ||
  fail "the embedded corpus without a shared folder: $(tail -1 own.err)"
# Rank 0's machine lacking the --resume checkpoint ends the run with its line.
mkdir -p empty
timeout 60 mpiexec -n 1 -wdir empty "$bin" "${resume[@]}" : -n 1 "$bin" "${resume[@]}" >/dev/null 2>gone.err
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "rank 0 without the checkpoint: mpiexec exited $rc (124: a rank hung)"
grep -q "error: rank 0: part/checkpoint: no checkpoint here" gone.err ||
  fail "rank 0 without the checkpoint: no line naming the rank ($(head -1 gone.err))"

# A rank three times as slow (it sleeps after each step) is named, with the part of its step that is slow.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --batch 2 --steps 16 --straggle 1:3 --out slow >/dev/null 2>slow.err ||
  fail "straggle: $(tail -1 slow.err)"
grep -q "rank 1 is slow: [0-9.]*x the median rank's time per step for 3 log points in a row, most of it outside the step" \
  slow.err || fail "straggle: the slow rank is not named: $(grep slow slow.err | head -2)"
grep -q "rank 0 is slow" slow.err && fail "straggle: rank 0 named as slow"
grep -q '"slow_ranks":\[{[^]]*"rank":1' slow/metrics.jsonl || fail "straggle: no slow_ranks record naming rank 1"
[ "$(grep -c '"rank_step_s":\[' slow/metrics.jsonl)" -ge 16 ] || fail "straggle: records without each rank's step time"
mpiexec -n 2 "$bin" pretrain "${common[@]}" --batch 2 --straggle 2:2 --out badstraggle >/dev/null 2>bs.err &&
  fail "--straggle of a rank outside the world accepted"
grep -q "outside the 2 ranks" bs.err || fail "--straggle: no clear line ($(head -1 bs.err))"
# SFT and DPO under two ranks: the same loop, so the same data-parallel step, from the dp checkpoint.
"$bin" tool-data --out td --sft 40 --dpo 10 --copy 40 >/dev/null || fail "tool-data"
mpiexec -n 2 "$bin" sft --ckpt full/checkpoint --data td/sft_train.jsonl --val td/sft_val.jsonl --steps 2 --batch 2 \
  --threads 1 --out sft >sft.out 2>sft.err || fail "dp sft: $(tail -1 sft.err)"
grep -q '"world_size":2' sft.out || fail "dp sft: the summary lacks world_size 2: $(cat sft.out)"
mpiexec -n 2 "$bin" dpo --ckpt sft/checkpoint --data td/dpo_train.jsonl --steps 2 --batch 1 --threads 1 --out dpo \
  >dpo.out 2>dpo.err || fail "dp dpo: $(tail -1 dpo.err)"
grep -q '"world_size":2' dpo.out || fail "dp dpo: the summary lacks world_size 2: $(cat dpo.out)"
grep -q '"rewards/accuracies"' dpo/metrics.jsonl || fail "dp dpo: no DPO metrics"

# A killed rank ends the run within seconds, and the last checkpoint stays complete.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --batch 2 --steps 100000 --ckpt-every 2 --out killed >/dev/null 2>&1 &
launcher=$!
for _ in $(seq 1 300); do [ -f killed/checkpoint/model.safetensors ] && break; sleep 0.1; done
victim=$(pgrep -P "$(pgrep -P $launcher | head -1)" | tail -1)
if [ -n "$victim" ]; then
  kill -9 "$victim"
  for _ in $(seq 1 200); do kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
  if kill -0 $launcher 2>/dev/null; then
    fail "a killed rank: the run went on for 20 s"
    kill $launcher
  fi
  wait $launcher && fail "a killed rank: mpiexec exited 0"
  "$bin" eval --ckpt killed/checkpoint --data data/val_000000.bin >/dev/null 2>&1 || fail "a killed rank: checkpoint unreadable"
else
  fail "a killed rank: no rank process found under mpiexec"
  kill $launcher
fi

# A rank that stops answering (--inject hang@STEP:RANK). Rank 1 runs no watchdog here, so rank 0's, waiting
# in the gradient average, ends the run after --collective-timeout seconds with its line; the launcher ends
# rank 1; the checkpoint of step 10 stays as it was.
hang=(--batch 2 --steps 20 --ckpt-every 5 --inject hang@12:1 --out hung)
SECONDS=0
mpiexec -n 1 "$bin" pretrain "${common[@]}" "${hang[@]}" --collective-timeout 3 : \
  -n 1 "$bin" pretrain "${common[@]}" "${hang[@]}" --collective-timeout 0 >/dev/null 2>hung.err &&
  fail "a hung rank: mpiexec exited 0"
[ "$SECONDS" -le 60 ] || fail "a hung rank: the run took $SECONDS s to end with a 3 s timeout"
grep -q "lingtrain: error: rank 0: all_reduce of [0-9]* bytes waited [3-9]\.[0-9] s for the other ranks, beyond --collective-timeout 3 s" \
  hung.err || fail "a hung rank: no watchdog line from rank 0: $(grep error hung.err | head -2)"
grep -q '"step": 10,' hung/checkpoint/trainer_state.json || fail "a hung rank: the checkpoint is not step 10's"
"$bin" eval --ckpt hung/checkpoint --data data/val_000000.bin >/dev/null 2>&1 || fail "a hung rank: checkpoint unreadable"
# The hung rank's own watchdog names its step (as a process alone does).
"$bin" pretrain "${common[@]}" --batch 2 --inject hang@3:0 --collective-timeout 2 --out hung1 >/dev/null 2>hung1.err &&
  fail "a hung process: exited 0"
grep -q "lingtrain: error: step 3 has run for [2-9]\.[0-9] s, beyond --collective-timeout 2 s" hung1.err ||
  fail "a hung process: no watchdog line: $(tail -1 hung1.err)"

finish dp
