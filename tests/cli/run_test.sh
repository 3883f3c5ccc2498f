#!/usr/bin/env bash
# The edges of a run a new user meets: a resume given the run's own command line plus --resume (as a
# preemptible job's script does), and refused only for a real change, naming both values; a warmup
# longer than its stage; the end-of-run sample on a model with few positions; the held-out figures of
# the run's end in metrics.jsonl, once, also after a resume.
# Usage: run_test.sh path/to/lingtrain
presets=$(realpath "$(dirname "$0")/../../model/presets")
source "$(dirname "$0")/common.sh"

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --batch 2 --seq 32 --threads 2
  --sample-prompt "" --eval-every 0 --warmup-steps 2 --steps 6)

# The same command line twice, the second time with --resume: it continues, bit for bit.
"$bin" pretrain "${common[@]}" --out whole >/dev/null 2>&1 || fail "uninterrupted run"
"$bin" pretrain "${common[@]}" --out own --stop-at 3 >/dev/null 2>&1 || fail "stopped run"
"$bin" pretrain "${common[@]}" --out own --resume own/checkpoint >/dev/null 2>own.err ||
  fail "resume with the run's own flags: $(tail -1 own.err)"
cmp -s whole/checkpoint/model.safetensors own/checkpoint/model.safetensors || fail "resume with its own flags: weights differ"
[ "$(grep -c '"heldout":"end"' own/metrics.jsonl)" = 1 ] || fail "the resumed log does not hold one end-of-run record"
tail -1 own/metrics.jsonl | grep -q '"heldout":"end".*"step":6\|"step":6.*"heldout":"end"' ||
  fail "the log's last record is not the end-of-run held-out figures: $(tail -1 own/metrics.jsonl)"
grep -q '"val_loss"' <(tail -1 own/metrics.jsonl) || fail "the end-of-run record has no val_loss"
# The summary's held-out loss is that record's, to the last digit (a double, not rounded to a float).
"$bin" pretrain "${common[@]}" --steps 2 --out two >two.txt 2>/dev/null || fail "two-step run"
[ "$(tail -1 two.txt | grep -o '"val_loss":[^,}]*')" = "$(tail -1 two/metrics.jsonl | grep -o '"val_loss":[^,}]*')" ] ||
  fail "the summary's val_loss is not the end-of-run record's: $(tail -1 two.txt | grep -o '"val_loss":[^,}]*')"

# A real change is refused, naming the checkpoint's value and the command line's.
expect_error "resume with another model" 'flag --model cannot change when resuming: the checkpoint.s is "tiny", the command line.s "small"' \
  "$bin" pretrain "${common[@]}" --model small --out own --resume own/checkpoint
expect_error "resume with another seed" "flag --seed cannot change when resuming: the checkpoint's is 1, the command line's 2" \
  "$bin" pretrain "${common[@]}" --seed 2 --out own --resume own/checkpoint
expect_error "resume with another recipe" "flag --recipe tiny is not the checkpoint's recipe" \
  "$bin" pretrain --recipe tiny --out own --resume own/checkpoint --threads 2

# A warmup as long as the stage: a tenth of the stage instead, said once, and the rate decays.
"$bin" pretrain "${common[@]}" --steps 20 --warmup-steps 30 --out warm >/dev/null 2>warm.err || fail "long warmup run"
grep -q "a warmup of 30 steps is not shorter than its 20 steps; warming up over 2 instead" warm.err ||
  fail "the long warmup is not reported: $(head -3 warm.err)"
awk -F'"lr":' 'NF > 1 && !/"heldout"/ { split($2, v, /[,}]/); last = v[1] } END { exit !(last < 1e-3) }' warm/metrics.jsonl ||
  fail "a 20-step cosine run with a long warmup does not decay: $(tail -2 warm/metrics.jsonl | head -1 | grep -o '"lr":[^,]*')"

# A model of 128 positions: the 200-token sample is cut to what fits, and the run ends with its summary.
sed 's/"max_position_embeddings": 256/"max_position_embeddings": 128/' "$presets/tiny.json" >short.json
"$bin" pretrain --model short.json --data data/train_000000.bin --val data/val_000000.bin --batch 2 --seq 32 \
  --threads 2 --steps 2 --warmup-steps 0 --out short >short.txt 2>short.err || fail "run on a 128-position model: $(tail -1 short.err)"
grep -q '^sample: The ' short.txt || fail "no sample on a 128-position model"
tail -1 short.txt | grep -q '"checkpoint"' || fail "no summary line on a 128-position model: $(tail -1 short.txt)"
grep -q "as many as the model's 128 positions leave after the prompt" short.err || fail "the shorter sample is not said"

finish run
