#!/usr/bin/env bash
# Parameter sharding under mpiexec (--shard-params on): 2 and 4 ranks each holding their part of every layer,
# alone, with expert parallelism and inside EDiT replicas, train like one process with a micro-batch per
# rank, the routing warmup on: the losses and gradient norms agree to a relative 1e-5 and so do the
# weights (lingtrain compare); at 4 ranks a rank holds at most 0.3 of one process's weights, gradients and
# AdamW state; the bytes sent per step are the plan's; the checkpoint is the whole model, resumed bit for
# bit on its layout, by one process and the reverse; EDiT's replicas like ZeRO-2's, its expert-parallel
# replicas too; SFT and DPO like one process.
# Usage: shard_params_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 3 --ckpt-every 0 --warmup-steps 2 --steps 6 --routing-warmup 4 --batch 1)
resumed=(--threads 1 --sample-prompt "" --eval-every 3 --ckpt-every 0)
zero3=(--dist edit --shard-group 2 --shard-params on)  # 2 EDiT replicas of 2 ranks' parts (at 4 ranks)

json_number() { grep -o "\"$2\":[0-9.e+-]*" "$1" | head -1 | cut -d: -f2; }

for ranks in 2 4; do
  "$bin" pretrain "${common[@]}" --accum $ranks --out one$ranks >one$ranks.txt 2>&1 ||
    fail "one process, $ranks micro-batches"
  out=sharded$ranks
  mpiexec -n $ranks "$bin" pretrain "${common[@]}" --shard-params on --out $out >$out.txt 2>$out.err ||
    fail "-n $ranks --shard-params on: $(tail -1 $out.err)"
  close one$ranks/metrics.jsonl $out/metrics.jsonl || fail "-n $ranks --shard-params on: losses differ"
  close one$ranks/metrics.jsonl $out/metrics.jsonl val_loss 2 || fail "-n $ranks --shard-params on: held-out differ"
  # (AdamW's update barely sees the gradients' scale: their norm does.)
  close one$ranks/metrics.jsonl $out/metrics.jsonl grad_norm || fail "-n $ranks --shard-params on: norms differ"
  same_weights one$ranks $out || fail "-n $ranks --shard-params on: weights differ: $(cat cmp.txt)"
  grep -q "\"shard_params\":true.*\"world_size\":$ranks" $out.txt ||
    fail "-n $ranks --shard-params on: the summary lacks shard_params and $ranks ranks: $(tail -1 $out.txt)"
  [ "$(grep -c '^{' $out.txt)" = 1 ] || fail "-n $ranks --shard-params on: not exactly one summary line"
done

# With expert parallelism: each rank's experts split over the ranks holding the same ones (-n 4
# --expert-parallel 2: 2 copies of each expert shard; 4: one), everything else over all ranks.
for layout in "2 2" "4 2" "4 4"; do
  read -r ranks degree <<<"$layout"
  out=ep${ranks}_$degree
  mpiexec -n $ranks "$bin" pretrain "${common[@]}" --shard-params on --expert-parallel $degree --out $out >$out.txt \
    2>$out.err || fail "-n $ranks --expert-parallel $degree --shard-params on: $(tail -1 $out.err)"
  close one$ranks/metrics.jsonl $out/metrics.jsonl || fail "-n $ranks --expert-parallel $degree: losses differ"
  close one$ranks/metrics.jsonl $out/metrics.jsonl grad_norm || fail "-n $ranks --expert-parallel $degree: norms differ"
  same_weights one$ranks $out || fail "-n $ranks --expert-parallel $degree: weights differ: $(cat cmp.txt)"
done

# A rank's weights, gradients and AdamW moments at 4 ranks: at most 0.3 of one process's, with expert
# parallelism too.
state() { awk -v w="$(json_number "$1" weights)" -v g="$(json_number "$1" gradients)" -v a="$(json_number "$1" adamw)" \
  'BEGIN { print w + g + a }'; }
for out in sharded4 ep4_2 ep4_4; do
  awk -v part="$(state $out.txt)" -v whole="$(state one4.txt)" 'BEGIN { exit !(whole > 0 && part <= 0.3 * whole) }' ||
    fail "$out: the state per rank is not at most 0.3 of one process's: $(state $out.txt) of $(state one4.txt)"
done

# The bytes a rank sends per step (no held-out figures in between): the plan's gathers and reduce-scatters
# and a few numbers more.
for ranks in 2 4; do
  mpiexec -n $ranks "$bin" pretrain "${common[@]}" --eval-every 0 --shard-params on --out bytes$ranks \
    >bytes$ranks.txt 2>&1 || fail "-n $ranks, bytes"
  "$bin" plan --model tiny --ranks $ranks --shard-params on --seq 32 --batch 1 --device cpu >plan$ranks.txt ||
    fail "plan -n $ranks"
  awk -v sent="$(json_number bytes$ranks.txt comm_bytes_per_step)" \
    -v gathered="$(json_number plan$ranks.txt parameter_all_gather)" \
    -v scattered="$(json_number plan$ranks.txt gradient_reduce_scatter)" \
    'BEGIN { planned = gathered + scattered; exit !(planned > 0 && sent >= planned && sent <= 1.01 * planned) }' ||
    fail "-n $ranks: sent $(json_number bytes$ranks.txt comm_bytes_per_step) bytes a step; $(cat plan$ranks.txt)"
done

# The parameters a rank holds: the plan's count, and a few aligned elements per layer more (within 1%).
awk -v held="$(json_number sharded4.txt weights)" -v planned="$(json_number plan4.txt params)" \
  'BEGIN { held /= 4; exit !(planned > 0 && held >= planned && held <= 1.01 * planned) }' ||
  fail "-n 4: a rank holds $(json_number sharded4.txt weights) bytes of weights, planned $(json_number plan4.txt params)"

# With expert parallelism the tokens' all-to-all too, which the plan counts at even expert loads: within 2%.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --eval-every 0 --shard-params on --expert-parallel 2 --out bytes_ep \
  >bytes_ep.txt 2>&1 || fail "-n 4 --expert-parallel 2, bytes"
"$bin" plan --model tiny --ranks 4 --expert-parallel 2 --shard-params on --seq 32 --batch 1 --device cpu \
  >plan_ep.txt || fail "plan -n 4 --expert-parallel 2"
awk -v sent="$(json_number bytes_ep.txt comm_bytes_per_step)" -v a="$(json_number plan_ep.txt parameter_all_gather)" \
  -v b="$(json_number plan_ep.txt gradient_reduce_scatter)" -v c="$(json_number plan_ep.txt expert_all_to_all)" \
  'BEGIN { planned = a + b + c; exit !(c > 0 && sent >= 0.98 * planned && sent <= 1.02 * planned) }' ||
  fail "-n 4 --expert-parallel 2: sent $(json_number bytes_ep.txt comm_bytes_per_step) a step; $(cat plan_ep.txt)"

# And inside EDiT replicas, with a sync every 5 steps and no warmup: the replica's gathers and reduce-scatters
# every step, the pseudo-gradient parts at each sync.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --eval-every 0 --steps 10 "${zero3[@]}" --local-sgd-warmup 0 \
  --sync-interval 5 --out bytes_edit >bytes_edit.txt 2>&1 || fail "edit, sharded, bytes"
"$bin" plan --model tiny --ranks 4 --dist edit --shard-group 2 --shard-params on --sync-interval 5 --seq 32 --batch 1 \
  --device cpu >plan_edit.txt || fail "plan edit, sharded"
awk -v sent="$(json_number bytes_edit.txt comm_bytes_per_step)" \
  -v a="$(json_number plan_edit.txt parameter_all_gather)" \
  -v b="$(json_number plan_edit.txt gradient_reduce_scatter)" -v c="$(json_number plan_edit.txt edit_sync)" \
  'BEGIN { planned = a + b + c; exit !(c > 0 && sent >= planned && sent <= 1.01 * planned) }' ||
  fail "edit, sharded: sent $(json_number bytes_edit.txt comm_bytes_per_step) bytes a step; $(cat plan_edit.txt)"

# Resumes: on the same layout bit for bit; 4 ranks' parts by one process; one process by 4 ranks' parts; 2
# expert shards' parts by one process.
resumes_bit_for_bit 4 sharded4 again --shard-params on
mpiexec -n 4 "$bin" pretrain "${common[@]}" --shard-params on --stop-at 3 --out part_one >/dev/null 2>&1 ||
  fail "4 ranks' parts, first half"
"$bin" pretrain --resume part_one/checkpoint --out part_one "${resumed[@]}" --accum 4 >/dev/null 2>part_one.err ||
  fail "4 ranks' parts resumed by one process: $(tail -1 part_one.err)"
same_weights one4 part_one || fail "4 ranks' parts resumed by one process: weights differ: $(cat cmp.txt)"
"$bin" pretrain "${common[@]}" --accum 4 --stop-at 3 --out from_one >/dev/null 2>&1 || fail "one process, first half"
mpiexec -n 4 "$bin" pretrain --resume from_one/checkpoint --out from_one "${resumed[@]}" --accum 1 --shard-params on \
  >/dev/null 2>from_one.err || fail "one process resumed by 4 ranks' parts: $(tail -1 from_one.err)"
same_weights one4 from_one || fail "one process resumed by 4 ranks' parts: weights differ: $(cat cmp.txt)"
mpiexec -n 4 "$bin" pretrain "${common[@]}" --shard-params on --expert-parallel 2 --stop-at 3 --out ep_one >/dev/null \
  2>&1 || fail "2 expert shards' parts, first half"
"$bin" pretrain --resume ep_one/checkpoint --out ep_one "${resumed[@]}" --accum 4 >/dev/null 2>ep_one.err ||
  fail "2 expert shards' parts resumed by one process: $(tail -1 ep_one.err)"
same_weights one4 ep_one || fail "2 expert shards' parts resumed by one process: weights differ: $(cat cmp.txt)"

# Inside EDiT replicas (--dist edit --shard-group 2 --shard-params on: 2 replicas of 2 ranks' parts): through
# the synchronous warmup like one process; with local steps and syncs like replicas sharded ZeRO-2 style;
# resumed bit for bit on its layout, by one process in its warmup and the reverse; A-EDiT's too.
mpiexec -n 4 "$bin" pretrain "${common[@]}" "${zero3[@]}" --local-sgd-warmup 6 --out edit_warm >/dev/null \
  2>edit_warm.err || fail "edit, sharded, warmup: $(tail -1 edit_warm.err)"
close one4/metrics.jsonl edit_warm/metrics.jsonl || fail "edit, sharded, warmup: losses differ"
same_weights one4 edit_warm || fail "edit, sharded, warmup: weights differ: $(cat cmp.txt)"
local_steps=(--local-sgd-warmup 1 --sync-interval 2)
mpiexec -n 4 "$bin" pretrain "${common[@]}" --dist edit --shard-group 2 "${local_steps[@]}" --out edit_zero2 \
  >/dev/null 2>edit_zero2.err || fail "edit, ZeRO-2: $(tail -1 edit_zero2.err)"
mpiexec -n 4 "$bin" pretrain "${common[@]}" "${zero3[@]}" "${local_steps[@]}" --out edit_zero3 >/dev/null \
  2>edit_zero3.err || fail "edit, sharded: $(tail -1 edit_zero3.err)"
grep -q '"sync":' edit_zero3/metrics.jsonl || fail "edit, sharded: no sync recorded"
close edit_zero2/metrics.jsonl edit_zero3/metrics.jsonl || fail "edit, sharded: losses differ from ZeRO-2's"
same_weights edit_zero2 edit_zero3 || fail "edit, sharded: weights differ from ZeRO-2's: $(cat cmp.txt)"
resumes_bit_for_bit 4 edit_zero3 edit_part "${zero3[@]}" "${local_steps[@]}"
mpiexec -n 4 "$bin" pretrain "${common[@]}" "${zero3[@]}" --local-sgd-warmup 6 --stop-at 3 --out warm_one >/dev/null \
  2>&1 || fail "edit, sharded, warmup, first half"
"$bin" pretrain --resume warm_one/checkpoint --out warm_one "${resumed[@]}" --accum 4 --dist dp >/dev/null \
  2>warm_one.err || fail "edit, sharded, resumed by one process: $(tail -1 warm_one.err)"
same_weights one4 warm_one || fail "edit, sharded, resumed by one process: weights differ: $(cat cmp.txt)"
"$bin" pretrain "${common[@]}" --accum 4 --stop-at 3 --out one_edit >/dev/null 2>&1 || fail "one process, first half"
mpiexec -n 4 "$bin" pretrain --resume one_edit/checkpoint --out one_edit "${resumed[@]}" --accum 1 "${zero3[@]}" \
  --local-sgd-warmup 6 >/dev/null 2>one_edit.err || fail "one process resumed in EDiT replicas: $(tail -1 one_edit.err)"
same_weights one4 one_edit || fail "one process resumed in EDiT replicas: weights differ: $(cat cmp.txt)"
mpiexec -n 4 "$bin" pretrain "${common[@]}" --steps 12 --dist aedit --shard-group 2 --shard-params on \
  --local-sgd-warmup 2 --sync-seconds 0.2 --min-total-steps 2 --out aedit >aedit.txt 2>aedit.err ||
  fail "aedit, sharded: $(tail -1 aedit.err)"
grep -q '"steps":12' aedit.txt || fail "aedit, sharded: not at step 12: $(tail -1 aedit.txt)"
# EDiT's expert-parallel replicas sharded (2 replicas of 2 ranks, each rank's experts its own, the rest in
# parts over the replica): through the warmup like one process, resumed by one process; with local steps
# like the unsharded replicas, and resumed bit for bit on its layout.
ep_zero3=(--dist edit --expert-parallel 2 --shard-params on)
mpiexec -n 4 "$bin" pretrain "${common[@]}" "${ep_zero3[@]}" --local-sgd-warmup 6 --out edit_ep_warm >/dev/null \
  2>edit_ep_warm.err || fail "edit, expert parallel, sharded, warmup: $(tail -1 edit_ep_warm.err)"
same_weights one4 edit_ep_warm || fail "edit, expert parallel, sharded, warmup: weights differ: $(cat cmp.txt)"
mpiexec -n 4 "$bin" pretrain "${common[@]}" "${ep_zero3[@]}" --local-sgd-warmup 6 --stop-at 3 --out ep_warm_one \
  >/dev/null 2>&1 || fail "edit, expert parallel, sharded, warmup, first half"
"$bin" pretrain --resume ep_warm_one/checkpoint --out ep_warm_one "${resumed[@]}" --accum 4 --dist dp >/dev/null \
  2>ep_warm_one.err || fail "edit, expert parallel, sharded, resumed by one process: $(tail -1 ep_warm_one.err)"
same_weights one4 ep_warm_one || fail "edit, expert parallel, sharded, resumed by one process: $(cat cmp.txt)"
mpiexec -n 4 "$bin" pretrain "${common[@]}" --dist edit --expert-parallel 2 "${local_steps[@]}" --out edit_ep \
  >/dev/null 2>edit_ep.err || fail "edit, expert parallel: $(tail -1 edit_ep.err)"
mpiexec -n 4 "$bin" pretrain "${common[@]}" "${ep_zero3[@]}" "${local_steps[@]}" --out edit_ep_zero3 >/dev/null \
  2>edit_ep_zero3.err || fail "edit, expert parallel, sharded: $(tail -1 edit_ep_zero3.err)"
same_weights edit_ep edit_ep_zero3 || fail "edit, expert parallel, sharded: weights differ: $(cat cmp.txt)"
resumes_bit_for_bit 4 edit_ep_zero3 edit_ep_part "${ep_zero3[@]}" "${local_steps[@]}"

# Post-training on 2 ranks' parts trains what one process trains with 2 micro-batches.
post_training_like_one_process sharded2/checkpoint sharded --shard-params on

finish shard_params_test
