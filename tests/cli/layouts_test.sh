#!/usr/bin/env bash
# A checkpoint resumed on another layout: another number of ranks, from data parallel to EDiT and back.
# The weights, the training state and the AdamW moments carry over, so where the layouts compute the
# same steps (one process with 2 micro-batches, 2 data-parallel ranks, 2 ranks of one EDiT replica) the
# resumed run's losses equal an uninterrupted one's to a relative 1e-5; EDiT's replicas, whose moments
# differ, resume with their average. Usage: layouts_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 0 --ckpt-every 0 --warmup-steps 2 --steps 6 --routing-warmup 4 --batch 2)
resumed=(--threads 1 --sample-prompt "" --eval-every 0 --ckpt-every 0)

"$bin" pretrain "${common[@]}" --accum 2 --out ref >/dev/null 2>&1 || fail "one process, 2 micro-batches"

# 2 data-parallel ranks, resumed by one process.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --stop-at 3 --out dp_one >/dev/null 2>&1 || fail "dp, first half"
"$bin" pretrain --resume dp_one/checkpoint --out dp_one "${resumed[@]}" --accum 2 >/dev/null 2>dp_one.err ||
  fail "dp resumed by one process: $(tail -1 dp_one.err)"
close ref/metrics.jsonl dp_one/metrics.jsonl || fail "dp resumed by one process: losses differ"

# One process, resumed by 2 ranks of one EDiT replica (ZeRO-2: each rank takes its shard of the moments).
"$bin" pretrain "${common[@]}" --accum 2 --stop-at 3 --out one_edit >/dev/null 2>&1 || fail "one process, first half"
mpiexec -n 2 "$bin" pretrain --resume one_edit/checkpoint --out one_edit "${resumed[@]}" --accum 1 --dist edit \
  --shard-group 2 >/dev/null 2>one_edit.err || fail "one process resumed by EDiT: $(tail -1 one_edit.err)"
close ref/metrics.jsonl one_edit/metrics.jsonl || fail "one process resumed by an EDiT replica: losses differ"

# That EDiT replica's per-rank checkpoint, resumed by 2 data-parallel ranks.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --dist edit --shard-group 2 --stop-at 3 --out edit_dp >/dev/null 2>&1 ||
  fail "edit, first half"
mpiexec -n 2 "$bin" pretrain --resume edit_dp/checkpoint --out edit_dp "${resumed[@]}" --dist dp >/dev/null \
  2>edit_dp.err || fail "EDiT resumed by dp: $(tail -1 edit_dp.err)"
close ref/metrics.jsonl edit_dp/metrics.jsonl || fail "an EDiT replica resumed by dp: losses differ"

# Two EDiT replicas (their moments differ), resumed by one process and by 4 ranks in replicas of 2, each
# taking the step's 4 sequences; then a resume that would take other sequences a step is one line.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --dist edit --local-sgd-warmup 0 --sync-interval 2 --out two >/dev/null \
  2>&1 || fail "edit, two replicas"
for layout in "1 --accum 2" "4 --shard-group 2 --batch 1"; do
  set -- $layout
  n=$1
  shift
  mpiexec -n $n "$bin" pretrain --resume two/checkpoint --steps 8 --out two_$n "${resumed[@]}" "$@" >two_$n.txt \
    2>two_$n.err || fail "two EDiT replicas resumed by $n ranks: $(tail -1 two_$n.err)"
  grep -q '"steps":8' two_$n.txt || fail "two EDiT replicas resumed by $n ranks: not at step 8: $(tail -1 two_$n.txt)"
done

expect_error "other sequences a step" "takes the checkpoint's 4 sequences a step (2 x 1 x 2 ranks)" \
  "$bin" pretrain --resume two/checkpoint --steps 8 --out x "${resumed[@]}"

# On the same layout a resume stays exact, so its settings cannot change.
"$bin" pretrain "${common[@]}" --dist edit --sync-interval 2 --stop-at 3 --out same >/dev/null 2>&1 ||
  fail "edit, 1 rank"
expect_error "another knob on the same layout" "cannot change when resuming on the same layout" \
  "$bin" pretrain --resume same/checkpoint --out x "${resumed[@]}" --sync-interval 3

finish layouts
