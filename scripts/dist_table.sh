#!/usr/bin/env bash
# The measured table of docs/distributed.md: data parallel, EDiT and A-EDiT on N ranks of one thread
# each (default 2), the tiny model on the embedded corpus with make train's global batch (16 x 128) and
# length (1500 steps), each with and without one rank slowed down twice (--straggle 1:2). Every mode
# runs twice: to the end (held-out loss at equal tokens) and for a fixed wall time (held-out loss after
# equal time). Prints a Markdown table; the runs stay in OUT.
# Usage: scripts/dist_table.sh [OUT=out/dist-table] [RANKS=2] [SECONDS=60]
set -euo pipefail
out=${1:-out/dist-table}
ranks=${2:-2}
seconds=${3:-60}
bin=$(realpath build/lingtrain)
mkdir -p "$out"
batch=$((16 / ranks))
base=(--model tiny --threads 1 --batch "$batch" --sample-prompt "" --eval-every 0 --ckpt-every 0)
# EDiT as the ATorch README runs it: a sync every 10 steps after 100 synchronous ones, norm weights,
# anomaly elimination, the clip at 10 and outer Nesterov SGD.
edit=(--dist edit --sync-interval 10 --local-sgd-warmup 100 --outer-optimizer sgd --clip-pseudo-grad 10
  --weight-by-norm on --skip-anomaly on --ewma-warmup 10)
# A-EDiT the same, a sync when 1 s has passed (about 10 steps of the fast rank here) unless the replicas
# took fewer than 10 steps together, and the replicas' step counts mixed into their weights.
aedit=(--dist aedit --sync-seconds 1 --min-total-steps 10 --local-sgd-warmup 100 --outer-optimizer sgd
  --clip-pseudo-grad 10 --weight-by-norm on --skip-anomaly on --ewma-warmup 10 --step-weight on)

"$bin" pretrain --model tiny --steps 1 --out "$out/corpus" --sample-prompt "" >/dev/null 2>&1  # the corpus, once
data=(--data "$out/corpus/data/train.bin" --val "$out/corpus/data/val.bin")

run() {  # NAME FLAGS...: one run, its summary line kept in NAME.json
  local name=$1
  shift
  if [ ! -s "$out/$name.json" ]; then
    mpiexec -n "$ranks" "$bin" pretrain "${base[@]}" "${data[@]}" "$@" --out "$out/$name" >"$out/$name.out" 2>"$out/$name.err"
    grep '^{' "$out/$name.out" >"$out/$name.json"
  fi
}

echo "| mode | straggle | wall s | tokens/s | vs dp | held-out at 3.07M tokens | tokens in ${seconds} s | held-out after ${seconds} s | bytes sent per step (rank 0) |"
echo "|---|---|---|---|---|---|---|---|---|"
for straggle in none 1:2; do
  s=()
  [ "$straggle" = none ] || s=(--straggle "$straggle")
  dp_rate=""
  for mode in dp edit aedit; do
    flags=()
    [ "$mode" = edit ] && flags=("${edit[@]}")
    [ "$mode" = aedit ] && flags=("${aedit[@]}")
    name=$mode-${straggle/:/x}
    run "$name" "${flags[@]}" "${s[@]}"
    run "$name-time" "${flags[@]}" "${s[@]}" --time-limit "$seconds"
    read -r wall tokens val bytes < <(jq -r '"\(.wall_s) \(.tokens) \(.val_loss) \(.comm_bytes_per_step)"' "$out/$name.json")
    read -r t_tokens t_val < <(jq -r '"\(.tokens) \(.val_loss)"' "$out/$name-time.json")
    rate=$(awk -v t="$tokens" -v w="$wall" 'BEGIN { printf "%.0f", t / w }')
    [ -n "$dp_rate" ] || dp_rate=$rate
    printf "| %s | %s | %.1f | %s | %.2fx | %.4f | %s | %.4f | %.0f |\n" "$mode" "$straggle" "$wall" "$rate" \
      "$(awk -v a="$rate" -v b="$dp_rate" 'BEGIN { print a / b }')" "$val" "$t_tokens" "$t_val" "$bytes"
  done
done
