#!/usr/bin/env bash
# lingtrain plan against real runs: the memory it plans for a rank (held between steps, the step's peak)
# against what the bench measures on the CPU (tiny and moe-s, two shapes each, and moe-s in bf16 where the
# CPU has a bf16 GEMM, its activations kept in bf16: within 10%), the bytes it
# plans a rank to send against what the communicator counted in data parallel, EDiT and expert-parallel
# runs under mpiexec (within 1%: the runs also send a few numbers of statistics; 2% with expert
# parallelism, whose real loads are uneven; in f32, and in bf16 where the CPU has a bf16 GEMM), and one
# clear line for a layout the
# model does not allow. Usage: plan_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

# json_field FILE KEY: the number after "KEY": in the last line of FILE.
json_field() { tail -n 1 "$1" | grep -o "\"$2\":[0-9.e+-]*" | head -n 1 | cut -d: -f2; }
# within A B TOLERANCE: |A - B| <= TOLERANCE * B.
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= t * b) }'; }

runs=("tiny 4 128 f32" "tiny 8 128 f32" "moe-s 4 256 f32" "moe-s 8 256 f32")
"$bin" --version | grep -q "bf16 GEMM (" && runs+=("moe-s 4 256 bf16")
for run in "${runs[@]}"; do
  set -- $run
  "$bin" bench --config $1 --batch $2 --seq $3 --dtype $4 --steps 1 --warmup 1 --threads 2 >bench.txt 2>&1 ||
    { fail "bench $run: $(tail -1 bench.txt)"; continue; }
  "$bin" plan --model $1 --batch $2 --seq $3 --dtype $4 --device cpu >plan.txt 2>&1 ||
    { fail "plan $run: $(tail -1 plan.txt)"; continue; }
  held=$(json_field bench.txt held_between_steps_mb) peak=$(json_field bench.txt peak_in_use_mb)
  planned_held=$(json_field plan.txt held_bytes) planned_peak=$(json_field plan.txt peak_bytes)
  mb() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }
  within "$(mb "$planned_held")" "$held" 0.01 || fail "$run: planned held $(mb "$planned_held") MiB, measured $held"
  within "$(mb "$planned_peak")" "$peak" 0.10 || fail "$run: planned peak $(mb "$planned_peak") MiB, measured $peak"
done

# Bytes sent per step by rank 0: data parallel's gradient all-reduce, and EDiT without a warmup (a sync
# every 5 steps over 10 steps, so two syncs and their share of each step).
make_text_shards
common=(--model tiny --data data/train_000000.bin --val data/val_000000.bin --seq 32 --threads 1 --sample-prompt ""
  --eval-every 0 --ckpt-every 0 --warmup-steps 2 --batch 1)
mpiexec -n 2 "$bin" pretrain "${common[@]}" --steps 4 --out dp >dp.txt 2>dp.err || fail "dp run: $(tail -1 dp.err)"
"$bin" plan --model tiny --ranks 2 >plan_dp.txt 2>&1 || fail "plan dp: $(tail -1 plan_dp.txt)"
planned=$(json_field plan_dp.txt gradient_all_reduce) sent=$(json_field dp.txt comm_bytes_per_step)
within "$planned" "$sent" 0.01 || fail "dp: planned $planned bytes a step, sent $sent"
mpiexec -n 2 "$bin" pretrain "${common[@]}" --steps 10 --dist edit --local-sgd-warmup 0 --sync-interval 5 \
  --out edit >edit.txt 2>edit.err || fail "edit run: $(tail -1 edit.err)"
"$bin" plan --model tiny --ranks 2 --dist edit --sync-interval 5 >plan_edit.txt 2>&1 || fail "plan edit"
planned=$(json_field plan_edit.txt edit_sync) sent=$(json_field edit.txt comm_bytes_per_step)
within "$planned" "$sent" 0.01 || fail "edit: planned $planned bytes a step, sent $sent"
# Expert parallel x data parallel: 2 copies of 2 experts' shards, the gradient all-reduces (the replicated
# parameters over all 4 ranks, the experts over their copies) and the tokens' all-to-all, which the plan
# counts at even expert loads (within 2%: a real run's loads are not even).
mpiexec -n 4 "$bin" pretrain "${common[@]}" --steps 4 --expert-parallel 2 --out ep >ep_run.txt 2>ep.err ||
  fail "expert-parallel run: $(tail -1 ep.err)"
"$bin" plan --model tiny --ranks 4 --expert-parallel 2 --seq 32 --device cpu >plan_ep.txt 2>&1 || fail "plan ep"
planned=$(awk -v a="$(json_field plan_ep.txt gradient_all_reduce)" -v b="$(json_field plan_ep.txt expert_all_to_all)" \
  'BEGIN { print a + b }')
sent=$(json_field ep_run.txt comm_bytes_per_step)
within "$planned" "$sent" 0.02 || fail "expert parallel: planned $planned bytes a step, sent $sent"
# The same in bf16 where the CPU has a bf16 GEMM: the rows of x go out as their kept bf16 copy.
if "$bin" --version | grep -q "bf16 GEMM ("; then
  mpiexec -n 4 "$bin" pretrain "${common[@]}" --steps 4 --expert-parallel 2 --dtype bf16 --out ep16 >ep16_run.txt \
    2>ep16.err || fail "expert-parallel bf16 run: $(tail -1 ep16.err)"
  "$bin" plan --model tiny --ranks 4 --expert-parallel 2 --seq 32 --device cpu --dtype bf16 >plan_ep16.txt 2>&1 ||
    fail "plan ep bf16"
  planned=$(awk -v a="$(json_field plan_ep16.txt gradient_all_reduce)" \
    -v b="$(json_field plan_ep16.txt expert_all_to_all)" 'BEGIN { print a + b }')
  sent=$(json_field ep16_run.txt comm_bytes_per_step)
  within "$planned" "$sent" 0.02 || fail "expert parallel, bf16: planned $planned bytes a step, sent $sent"
fi
# And the parameters a rank holds there: the run's flat weights are the plan's count in f32, exactly.
held=$(json_field ep_run.txt weights) planned=$(json_field plan_ep.txt params)
[ -n "$held" ] && [ "$held" = "$((planned * 4))" ] ||
  fail "expert parallel: a rank's weights $held bytes, planned $planned parameters"
# EDiT with expert-parallel replicas (2 of 2 ranks), syncs as above: the replicated gradients within a
# replica every step, the tokens, and the syncs across replicas.
mpiexec -n 4 "$bin" pretrain "${common[@]}" --steps 10 --dist edit --expert-parallel 2 --local-sgd-warmup 0 \
  --sync-interval 5 --out edit_ep >edit_ep.txt 2>edit_ep.err || fail "edit ep run: $(tail -1 edit_ep.err)"
"$bin" plan --model tiny --ranks 4 --dist edit --expert-parallel 2 --sync-interval 5 --seq 32 --device cpu \
  >plan_edit_ep.txt 2>&1 || fail "plan edit ep"
planned=$(awk -v a="$(json_field plan_edit_ep.txt replica_all_reduce)" \
  -v b="$(json_field plan_edit_ep.txt expert_all_to_all)" -v c="$(json_field plan_edit_ep.txt edit_sync)" \
  'BEGIN { print a + b + c }')
sent=$(json_field edit_ep.txt comm_bytes_per_step)
within "$planned" "$sent" 0.02 || fail "edit, expert parallel: planned $planned bytes a step, sent $sent"

# Layouts: Ling-Plus planned without allocating it; the expert-parallel split of its routed experts, and
# with sharding everything, shrinks a rank's share.
"$bin" plan --model ling-plus --ranks 64 --expert-parallel 8 --shard-params on --dtype bf16 --device-memory 80 \
  >plus.txt 2>&1 || fail "plan ling-plus: $(tail -1 plus.txt)"
"$bin" plan --model moe-s --ranks 4 >one.txt && "$bin" plan --model moe-s --ranks 4 --expert-parallel 4 >ep.txt &&
  "$bin" plan --model moe-s --ranks 4 --expert-parallel 4 --shard-params on >sharded.txt || fail "plan moe-s layouts"
whole=$(json_field one.txt params) ep=$(json_field ep.txt params) sharded=$(json_field sharded.txt params)
awk -v whole="$whole" -v ep="$ep" -v sharded="$sharded" -v routed="$(json_field one.txt routed_expert_params)" \
  'BEGIN { exit !(whole - ep == routed * 3 / 4 && sharded * 4 <= whole + 4) }' ||
  fail "moe-s on 4 ranks: parameters per rank $whole, expert parallel $ep, sharded $sharded"

expect_error "experts do not split" "8 experts per layer do not split over --expert-parallel 3" \
  "$bin" plan --model tiny --ranks 3 --expert-parallel 3
expect_error "degree does not divide the ranks" "--expert-parallel 2 does not divide the ranks (3)" \
  "$bin" plan --model tiny --ranks 3 --expert-parallel 2
expect_error "dense model split by experts" "has no routed experts" \
  "$bin" plan --model dense-124m --ranks 2 --expert-parallel 2
expect_error "shard group under dp" "--shard-group belongs to --dist edit" \
  "$bin" plan --model tiny --ranks 2 --shard-group 2

finish plan
