#!/usr/bin/env bash
# EDiT and A-EDiT under mpiexec: the ZeRO-2 shard groups train exactly like data parallel while the
# replicas still average their gradients (the local-SGD warmup), an EDiT run with every penalty on
# resumes bit for bit (2 ranks, and 4 ranks in shard groups of 2), A-EDiT lets a fast replica take more
# steps than a slow one while the run still sees its token budget, and misused flags are refused.
# Usage: edit_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 0 --ckpt-every 0 --warmup-steps 2 --steps 6 --batch 1)

# ZeRO-2: while the warmup averages gradients across replicas, EDiT is data parallel with the gradients
# and AdamW sharded, so it must train as dp does (up to the order of the gradient sums).
for mesh in "2 2" "4 2" "4 1"; do
  set -- $mesh
  [ -d dp$1 ] || mpiexec -n $1 "$bin" pretrain "${common[@]}" --out dp$1 >/dev/null 2>&1 || fail "dp $1"
  mpiexec -n $1 "$bin" pretrain "${common[@]}" --dist edit --shard-group $2 --local-sgd-warmup 100 --out z$1$2 \
    >/dev/null 2>&1 || fail "edit $1 ranks, shard group $2"
  close dp$1/metrics.jsonl z$1$2/metrics.jsonl || fail "edit in warmup, $1 ranks, shard group $2: losses differ from dp"
done

# Resume bit for bit with every knob that keeps state: the anchor, the outer momentum, the detectors.
# The 2-rank run resumes with its own flags again; the 4-rank one with a bare --resume, which takes the
# distribution settings (--dist, --shard-group, the knobs) from its checkpoint.
knobs=(--dist edit --sync-interval 2 --outer-optimizer sgd --skip-anomaly on --ewma-warmup 1 --weight-by-norm on
  --clip-pseudo-grad 1)
for mesh in "2 1" "4 2"; do
  set -- $mesh
  mpiexec -n $1 "$bin" pretrain "${common[@]}" "${knobs[@]}" --routing-warmup 4 --steps 8 --shard-group $2 \
    --out full$1 >/dev/null 2>&1 || fail "edit $1 full run"
  mpiexec -n $1 "$bin" pretrain "${common[@]}" "${knobs[@]}" --routing-warmup 4 --steps 8 --shard-group $2 \
    --out part$1 --stop-at 3 >/dev/null 2>&1 || fail "edit $1 stopped run"
  if [ $1 = 2 ]; then resume_flags=("${knobs[@]}" --shard-group $2); else resume_flags=(); fi
  mpiexec -n $1 "$bin" pretrain --resume part$1/checkpoint --out part$1 --threads 1 --sample-prompt "" --eval-every 0 \
    --ckpt-every 0 "${resume_flags[@]}" >/dev/null 2>resume$1.err || fail "edit $1 resume: $(head -1 resume$1.err)"
  for f in model.safetensors $(cd full$1/checkpoint && echo edit/*); do
    cmp -s full$1/checkpoint/$f part$1/checkpoint/$f || fail "edit $1 ranks: resumed $f differs"
  done
  [ "$(ls full$1/checkpoint/edit | wc -l)" = "$1" ] || fail "edit $1 ranks: not one state file per rank"
  grep -q '"sync":{' full$1/metrics.jsonl || fail "edit $1 ranks: no sync in the metrics"
done

# A-EDiT: rank 1 three times slower. The fast replica takes more of the steps, and the stage's budget
# (steps x replicas) is met exactly, every step in rounds (no synchronous warmup, where the two replicas
# step together). The rounds (0.1 s) are short against the run, so several of them
# end by the timer: in one long round the first quotas (half the budget each) would cap the fast
# replica, and the split would measure the machine's speed rather than the replicas' pace.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --steps 60 --dist aedit --sync-seconds 0.1 --min-total-steps 4 \
  --local-sgd-warmup 0 --straggle 1:3 --eval-every 7 --out aedit >aedit.txt 2>aedit.err ||
  fail "aedit: $(tail -1 aedit.err)"
# Every --eval-every point a round passed (but the run's last step) has its held-out loss at that
# round's end; the end of the run has one more, over all of the held-out data.
awk -F'"step":' 'NF > 1 && !/"heldout"/ { split($2, s, /[,}]/); step = s[1] + 0;
                   if (int(step / 7) > int(prev / 7) && step < 60) want++; if (/"val_loss"/) got++; prev = step }
                 END { exit !(want > 0 && got == want) }' aedit/metrics.jsonl ||
  fail "aedit: the eval points passed inside rounds lack their held-out loss"
[ "$(grep -c '"heldout":"end"' aedit/metrics.jsonl)" = 1 ] || fail "aedit: no end-of-run held-out record"
grep -q '"tokens":3840,' aedit.txt || fail "aedit: the summary does not count 60 x 2 x 32 tokens: $(cat aedit.txt)"
awk -F'"replica_steps":\\[' 'NF > 1 { split($2, s, /[],]/); a += s[1]; b += s[2] } END { exit !(a > 1.5 * b && a + b == 120) }' \
  aedit/metrics.jsonl || fail "aedit: the fast replica did not take most of the 120 steps: $(grep -o 'replica_steps[^]]*' aedit/metrics.jsonl | tr '\n' ' ')"
# The slow rank is named: its time per step (its round over its fewer steps) is above 1.5x the fast one's
# at 3 round ends in a row. Rounds of 0.03 s, so a run of ~0.3 s or more has several whatever the machine.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --steps 100 --dist aedit --sync-seconds 0.03 --min-total-steps 2 \
  --local-sgd-warmup 0 --straggle 1:3 --out aslow >/dev/null 2>aslow.err || fail "aedit, slow rank: $(tail -1 aslow.err)"
grep -q "rank 1 is slow: .* most of it outside the step" aslow.err ||
  fail "aedit: the slow rank is not named ($(grep -c '"replica_steps"' aslow/metrics.jsonl) rounds)"
grep -q '"slow_ranks":\[{[^]]*"rank":1' aslow/metrics.jsonl || fail "aedit: no slow_ranks record naming rank 1"

# --dist edit alone runs the EDiT README's example settings, the synchronous warmup a third of the run
# (30 steps: 10), then a sync every 10 steps (at 20 and 30).
mpiexec -n 2 "$bin" pretrain "${common[@]}" --steps 30 --dist edit --out defaults >/dev/null 2>defaults.err ||
  fail "edit with its defaults: $(tail -1 defaults.err)"
for setting in '"sync_interval": 10,' '"local_sgd_warmup": 10,' '"outer_optimizer": "sgd",' \
  '"clip_pseudo_grad": 10.0,' '"weight_by_norm": true' '"skip_anomaly": true,' '"ewma_warmup_steps": 10,'; do
  sed -n '/"edit": {/,/}/p' defaults/checkpoint/trainer_state.json | grep -qF "$setting" ||
    fail "edit's defaults: the checkpoint's settings lack $setting"
done
[ "$(grep -c '"sync":{' defaults/metrics.jsonl)" = 2 ] || fail "edit's defaults: not 2 syncs in 30 steps"

# Misuse: one clear line each.
expect_error "edit flag under dp" "belongs to --dist edit" "$bin" pretrain "${common[@]}" --sync-interval 4
expect_error "sync-interval under aedit" "aedit syncs by time" "$bin" pretrain "${common[@]}" --dist aedit --sync-interval 4
mpiexec -n 2 "$bin" pretrain "${common[@]}" --dist edit --shard-group 3 --out sg >/dev/null 2>sg.err &&
  fail "a shard group that does not divide the ranks accepted"
grep -q "must divide the number of ranks (2)" sg.err || fail "shard group 3 of 2 ranks: no clear line ($(head -1 sg.err))"
# (Resumes on another layout: tests/cli/layouts_test.sh.)

finish edit
