#!/usr/bin/env bash
# Expert parallelism under mpiexec (--expert-parallel G): 2 ranks x 2 experts' shards, 4 ranks as 2 copies
# of 2 shards (expert parallel x data parallel) and 4 shards train like one process with a micro-batch per
# rank, the routing warmup on: the losses agree to a relative 1e-5 and so do the weights (lingtrain compare);
# each rank holds a quarter of the routed experts' state at 4 shards; the checkpoint is the whole model,
# resumed bit for bit on its layout, and by one process and the reverse; EDiT's and A-EDiT's replicas as
# expert-parallel groups; SFT and DPO like one process, data parallel too; a layout the run cannot take
# is one clear line before anything is made.
# Usage: expert_parallel_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 3 --ckpt-every 0 --warmup-steps 2 --steps 6 --routing-warmup 4 --batch 1)
resumed=(--threads 1 --sample-prompt "" --eval-every 3 --ckpt-every 0)

for ranks in 2 4; do
  "$bin" pretrain "${common[@]}" --accum $ranks --out one$ranks >/dev/null 2>&1 ||
    fail "one process, $ranks micro-batches"
done
for layout in "2 2" "4 2" "4 4"; do
  read -r ranks degree <<<"$layout"
  out=ep${ranks}_$degree
  mpiexec -n $ranks "$bin" pretrain "${common[@]}" --expert-parallel $degree --out $out >$out.txt 2>$out.err ||
    fail "-n $ranks --expert-parallel $degree: $(tail -1 $out.err)"
  close one$ranks/metrics.jsonl $out/metrics.jsonl || fail "-n $ranks --expert-parallel $degree: losses differ"
  close one$ranks/metrics.jsonl $out/metrics.jsonl val_loss 2 ||
    fail "-n $ranks --expert-parallel $degree: held-out losses differ"
  # (AdamW's update barely sees the gradients' scale: their norm does.)
  close one$ranks/metrics.jsonl $out/metrics.jsonl grad_norm ||
    fail "-n $ranks --expert-parallel $degree: gradient norms differ"
  same_weights one$ranks $out || fail "-n $ranks --expert-parallel $degree: weights differ: $(cat cmp.txt)"
  grep -q "\"expert_parallel\":$degree" $out.txt || fail "-n $ranks --expert-parallel $degree: not in the summary"
  [ "$(grep -c '^{' $out.txt)" = 1 ] || fail "-n $ranks --expert-parallel $degree: not exactly one summary line"
done

# The routed experts' weights, gradients and AdamW moments on a rank: a quarter of one process's at 4 shards.
experts() { grep -o '"routed_experts":[0-9]*' "$1" | cut -d: -f2; }
"$bin" pretrain "${common[@]}" --accum 4 --out whole >whole.txt 2>/dev/null || fail "one process"
[ -n "$(experts whole.txt)" ] && [ $((4 * $(experts ep4_4.txt))) -eq "$(experts whole.txt)" ] ||
  fail "the routed experts' state per rank is not a quarter: $(experts ep4_4.txt) of $(experts whole.txt)"

# Resumes: on the same layout bit for bit; 4 shards by one process; one process by 4 shards.
resumes_bit_for_bit 4 ep4_4 again --expert-parallel 4
mpiexec -n 4 "$bin" pretrain "${common[@]}" --expert-parallel 4 --stop-at 3 --out to_one >/dev/null 2>&1 ||
  fail "4 shards, first half"
"$bin" pretrain --resume to_one/checkpoint --out to_one "${resumed[@]}" --accum 4 >/dev/null 2>to_one.err ||
  fail "4 shards resumed by one process: $(tail -1 to_one.err)"
same_weights one4 to_one || fail "4 shards resumed by one process: weights differ: $(cat cmp.txt)"
"$bin" pretrain "${common[@]}" --accum 4 --stop-at 3 --out from_one >/dev/null 2>&1 || fail "one process, first half"
mpiexec -n 4 "$bin" pretrain --resume from_one/checkpoint --out from_one "${resumed[@]}" --accum 1 --expert-parallel 4 \
  >/dev/null 2>from_one.err || fail "one process resumed by 4 shards: $(tail -1 from_one.err)"
same_weights one4 from_one || fail "one process resumed by 4 shards: weights differ: $(cat cmp.txt)"

# EDiT with expert-parallel replicas: 2 replicas of 2 ranks. Through its synchronous warmup it trains what
# one process trains, and its checkpoint from then (each rank's file its own flat layout) resumes on one
# process with the same moments; with local steps and syncs it resumes bit for bit on its layout, and on
# another one.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --dist edit --expert-parallel 2 --local-sgd-warmup 6 --out edit_warm \
  >/dev/null 2>edit_warm.err || fail "edit, expert parallel, warmup: $(tail -1 edit_warm.err)"
close one4/metrics.jsonl edit_warm/metrics.jsonl || fail "edit, expert parallel, warmup: losses differ"
same_weights one4 edit_warm || fail "edit, expert parallel, warmup: weights differ: $(cat cmp.txt)"
edit=(--dist edit --expert-parallel 2 --local-sgd-warmup 1 --sync-interval 2)
mpiexec -n 4 "$bin" pretrain "${common[@]}" "${edit[@]}" --out edit_full >edit_full.txt 2>edit_full.err ||
  fail "edit, expert parallel: $(tail -1 edit_full.err)"
grep -q '"sync":' edit_full/metrics.jsonl || fail "edit, expert parallel: no sync recorded"
resumes_bit_for_bit 4 edit_full edit_part "${edit[@]}"
mpiexec -n 4 "$bin" pretrain "${common[@]}" --dist edit --expert-parallel 2 --local-sgd-warmup 6 --stop-at 3 \
  --out warm_one >/dev/null 2>&1 || fail "edit, expert parallel, warmup, first half"
"$bin" pretrain --resume warm_one/checkpoint --out warm_one "${resumed[@]}" --accum 4 --dist dp >/dev/null \
  2>warm_one.err || fail "edit, expert parallel, resumed by one process: $(tail -1 warm_one.err)"
close one4/metrics.jsonl warm_one/metrics.jsonl || fail "edit, expert parallel, resumed by one process: losses differ"
same_weights one4 warm_one || fail "edit, expert parallel, resumed by one process: weights differ: $(cat cmp.txt)"
# And the reverse: 2 EDiT replicas of 2 ZeRO-2 shards, in their warmup, resumed by 4 expert shards.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --dist edit --shard-group 2 --local-sgd-warmup 6 --stop-at 3 \
  --out zero_ep >/dev/null 2>&1 || fail "edit, ZeRO-2, first half"
mpiexec -n 4 "$bin" pretrain --resume zero_ep/checkpoint --out zero_ep "${resumed[@]}" --dist dp --expert-parallel 4 \
  >/dev/null 2>zero_ep.err || fail "edit, ZeRO-2, resumed by 4 expert shards: $(tail -1 zero_ep.err)"
same_weights one4 zero_ep || fail "edit, ZeRO-2, resumed by 4 expert shards: weights differ: $(cat cmp.txt)"
mpiexec -n 2 "$bin" pretrain --resume edit_part/checkpoint --out edit_moved "${resumed[@]}" --accum 2 --steps 8 \
  >edit_moved.txt 2>edit_moved.err || fail "edit, expert parallel, resumed on 2 ranks: $(tail -1 edit_moved.err)"
grep -q '"steps":8' edit_moved.txt || fail "edit, expert parallel, resumed on 2 ranks: not at step 8"

# A-EDiT with expert-parallel replicas: each replica's two ranks step together at the replica's own pace
# (its rank 2 three times slower), in rounds that end with a sync.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --steps 24 --dist aedit --expert-parallel 2 --local-sgd-warmup 2 \
  --sync-seconds 0.2 --min-total-steps 2 --straggle 2:3 --out aedit >aedit.txt 2>aedit.err ||
  fail "aedit, expert parallel: $(tail -1 aedit.err)"
grep -q '"steps":24' aedit.txt || fail "aedit, expert parallel: not at step 24: $(tail -1 aedit.txt)"
grep -o '"replica_steps":\[[0-9]*,[0-9]*\]' aedit/metrics.jsonl | tr -d '"replica_steps:[]' |
  awk -F, 'BEGIN { uneven = 0 } $1 > $2 { uneven = 1 } END { exit !uneven }' ||
  fail "aedit, expert parallel: the slow replica kept pace: $(grep -o '"replica_steps":[^]]*]' aedit/metrics.jsonl)"

# Post-training on 2 ranks, data parallel and with experts split, trains what one process trains with 2
# micro-batches.
for degree in 1 2; do post_training_like_one_process ep2_2/checkpoint ep$degree --expert-parallel $degree; done

# Layouts the run cannot take: one line (on every rank), nothing made.
expect_error "one process" "does not divide the 1 ranks" "$bin" pretrain "${common[@]}" --expert-parallel 2 --out bad1
mpiexec -n 4 "$bin" pretrain "${common[@]}" --expert-parallel 3 --out bad2 >/dev/null 2>bad2.err &&
  fail "-n 4 --expert-parallel 3 ran"
grep -q "expert-parallel 3 does not divide the 4 ranks" bad2.err || fail "-n 4: $(head -1 bad2.err)"
mpiexec -n 3 "$bin" pretrain "${common[@]}" --expert-parallel 3 --out bad3 >/dev/null 2>bad3.err &&
  fail "8 experts over 3 ran"
grep -q "8 routed experts per MoE layer do not split over 3" bad3.err || fail "8 experts over 3: $(head -1 bad3.err)"
mpiexec -n 2 "$bin" pretrain "${common[@]}" --model dense-124m --expert-parallel 2 --out bad4 >/dev/null 2>bad4.err &&
  fail "a dense model ran"
grep -q "is dense, it has no routed experts" bad4.err || fail "a dense model: $(head -1 bad4.err)"
mpiexec -n 4 "$bin" pretrain "${common[@]}" --dist edit --shard-group 2 --expert-parallel 2 --out bad6 >/dev/null \
  2>bad6.err && fail "a sharded expert-parallel replica ran"
grep -q "not sharded further" bad6.err || fail "--shard-group: $(head -1 bad6.err)"
for bad in bad1 bad2 bad3 bad4 bad6; do [ ! -e $bad ] || fail "$bad: the failed run made its folder"; done

finish expert_parallel_test
