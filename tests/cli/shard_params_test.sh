#!/usr/bin/env bash
# Parameter sharding under mpiexec (--shard-params on): 2 and 4 ranks each holding their part of every layer,
# alone and with expert parallelism, train like one process with a micro-batch per rank, the routing warmup
# on: the losses and gradient norms agree to a relative 1e-5 and so do the weights (lingtrain compare); at 4
# ranks a rank holds at most 0.3 of one process's weights, gradients and AdamW state; the bytes sent per
# step are the plan's; the checkpoint is the whole model, resumed bit for bit on its layout, by one process
# and the reverse; SFT and DPO like one process; a layout it does not combine with yet is one clear line
# before anything is made.
# Usage: shard_params_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 3 --ckpt-every 0 --warmup-steps 2 --steps 6 --routing-warmup 4 --batch 1)
resumed=(--threads 1 --sample-prompt "" --eval-every 3 --ckpt-every 0)

# same_weights A B: the largest per-tensor relative difference of two checkpoints is at most 1e-5.
same_weights() {
  "$bin" compare --ckpt "$1/checkpoint" --vs "$2/checkpoint" >cmp.txt 2>&1 &&
    awk -F'"max_relative":' '{ split($2, v, ","); exit !(v[1] + 0 <= 1e-5) }' cmp.txt
}
json_number() { grep -o "\"$2\":[0-9.e+-]*" "$1" | head -1 | cut -d: -f2; }

for ranks in 2 4; do
  "$bin" pretrain "${common[@]}" --accum $ranks --out one$ranks >one$ranks.txt 2>&1 ||
    fail "one process, $ranks micro-batches"
  out=sharded$ranks
  mpiexec -n $ranks "$bin" pretrain "${common[@]}" --shard-params on --out $out >$out.txt 2>$out.err ||
    fail "-n $ranks --shard-params on: $(tail -1 $out.err)"
  close one$ranks/metrics.jsonl $out/metrics.jsonl || fail "-n $ranks --shard-params on: losses differ"
  close one$ranks/metrics.jsonl $out/metrics.jsonl val_loss 2 || fail "-n $ranks --shard-params on: held-out losses differ"
  # (AdamW's update barely sees the gradients' scale: their norm does.)
  close one$ranks/metrics.jsonl $out/metrics.jsonl grad_norm || fail "-n $ranks --shard-params on: gradient norms differ"
  same_weights one$ranks $out || fail "-n $ranks --shard-params on: weights differ: $(cat cmp.txt)"
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
  grep -q '"runs":true' plan$ranks.txt || fail "plan -n $ranks: sharded data parallel is not a layout that runs"
  awk -v sent="$(json_number bytes$ranks.txt comm_bytes_per_step)" \
    -v gathered="$(json_number plan$ranks.txt parameter_all_gather)" \
    -v scattered="$(json_number plan$ranks.txt gradient_reduce_scatter)" \
    'BEGIN { planned = gathered + scattered; exit !(planned > 0 && sent >= planned && sent <= 1.01 * planned) }' ||
    fail "-n $ranks: sent $(json_number bytes$ranks.txt comm_bytes_per_step) bytes a step, planned $(cat plan$ranks.txt)"
done

# With expert parallelism the tokens' all-to-all too, which the plan counts at even expert loads: within 2%.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --eval-every 0 --shard-params on --expert-parallel 2 --out bytes_ep \
  >bytes_ep.txt 2>&1 || fail "-n 4 --expert-parallel 2, bytes"
"$bin" plan --model tiny --ranks 4 --expert-parallel 2 --shard-params on --seq 32 --batch 1 --device cpu \
  >plan_ep.txt || fail "plan -n 4 --expert-parallel 2"
awk -v sent="$(json_number bytes_ep.txt comm_bytes_per_step)" -v a="$(json_number plan_ep.txt parameter_all_gather)" \
  -v b="$(json_number plan_ep.txt gradient_reduce_scatter)" -v c="$(json_number plan_ep.txt expert_all_to_all)" \
  'BEGIN { planned = a + b + c; exit !(c > 0 && sent >= 0.98 * planned && sent <= 1.02 * planned) }' ||
  fail "-n 4 --expert-parallel 2: sent $(json_number bytes_ep.txt comm_bytes_per_step) bytes a step, planned $(cat plan_ep.txt)"

# Resumes: on the same layout bit for bit; 4 ranks' parts by one process; one process by 4 ranks' parts; 2
# expert shards' parts by one process.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --shard-params on --stop-at 3 --out again >/dev/null 2>&1 ||
  fail "first half"
mpiexec -n 4 "$bin" pretrain --resume again/checkpoint --out again "${resumed[@]}" >/dev/null 2>again.err ||
  fail "resumed on its layout: $(tail -1 again.err)"
cmp -s again/checkpoint/model.safetensors sharded4/checkpoint/model.safetensors || fail "resumed on its layout: weights differ"
cmp -s again/checkpoint/optimizer.safetensors sharded4/checkpoint/optimizer.safetensors ||
  fail "resumed on its layout: the optimizer differs"
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

# Post-training on 2 ranks' parts trains what one process trains with 2 micro-batches (SFT's rows and DPO's
# pairs weigh every rank's share alike, trainer/trainer.h).
"$bin" tool-data --out td --sft 16 --dpo 16 --copy 8 >/dev/null || fail "tool-data"
for kind in sft dpo; do
  seq=512
  [ $kind = dpo ] && seq=1024
  post=(--ckpt sharded2/checkpoint --data td/${kind}_train.jsonl --steps 3 --batch 1 --seq $seq --threads 1
    --eval-every 0 --sample-prompt "")
  "$bin" $kind "${post[@]}" --accum 2 --out ${kind}_one >/dev/null 2>${kind}_one.err ||
    fail "$kind, one process: $(tail -1 ${kind}_one.err)"
  mpiexec -n 2 "$bin" $kind "${post[@]}" --shard-params on --out ${kind}_sharded >/dev/null 2>${kind}_sharded.err ||
    fail "$kind, --shard-params on: $(tail -1 ${kind}_sharded.err)"
  close ${kind}_one/metrics.jsonl ${kind}_sharded/metrics.jsonl lm_loss 3 || fail "$kind, --shard-params on: losses differ"
  close ${kind}_one/metrics.jsonl ${kind}_sharded/metrics.jsonl grad_norm 3 ||
    fail "$kind, --shard-params on: gradient norms differ"
  same_weights ${kind}_one ${kind}_sharded || fail "$kind, --shard-params on: weights differ: $(cat cmp.txt)"
done

# What it does not combine with yet: one line (on every rank), nothing made.
mpiexec -n 2 "$bin" pretrain "${common[@]}" --shard-params on --dist aedit --out bad1 >/dev/null 2>bad1.err &&
  fail "--shard-params with --dist aedit ran"
grep -q "shard-params with --dist aedit is not supported yet" bad1.err || fail "aedit: $(head -1 bad1.err)"
mpiexec -n 2 "$bin" pretrain "${common[@]}" --shard-params on --dist edit --out bad2 >/dev/null 2>bad2.err &&
  fail "--shard-params with --dist edit ran"
grep -q "shard-params with --dist edit is not supported yet" bad2.err || fail "edit: $(head -1 bad2.err)"
for bad in bad1 bad2; do [ ! -e $bad ] || fail "$bad: the failed run made its folder"; done

finish shard_params_test
