# Sourced by the command-line tests: the binary ($1, made absolute), a scratch folder removed on exit
# and made the working directory, a failure counter, and the checks they share.
set -u
bin=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_error NAME PATTERN CMD...: CMD must exit non-zero with exactly one stderr line matching PATTERN.
expect_error() {
  local name=$1 pattern=$2
  shift 2
  if "$@" >out.txt 2>err.txt; then fail "$name: exited 0"; return; fi
  local lines
  lines=$(wc -l <err.txt)
  [ "$lines" -eq 1 ] || fail "$name: $lines stderr lines: $(cat err.txt)"
  grep -q -- "$pattern" err.txt || fail "$name: stderr '$(cat err.txt)' lacks '$pattern'"
}

# make_text_shards: a small two-part text corpus as data/train_000000.bin and data/val_000000.bin,
# tokenised by the binary itself.
make_text_shards() {
  for i in $(seq 1 400); do echo "line $i: the quick brown fox $((i * 7 % 13)) jumps over $((i % 5)) lazy dogs."; done >a.txt
  for i in $(seq 1 100); do echo "int f$i(int x) { return x * $i + $((i % 3)); }"; done >b.txt
  "$bin" shards --out data/train a.txt b.txt >/dev/null || fail "shards"
  "$bin" shards --out data/val b.txt >/dev/null || fail "shards val"
}

# close A B [KEY [COUNT]]: every KEY (lm_loss) of metrics files A and B agrees to a relative 1e-5, and
# there are COUNT (6) of them.
close() {
  local key=${3:-lm_loss} count=${4:-6}
  paste <(grep -o "\"$key\":[^,}]*" "$1" | cut -d: -f2) <(grep -o "\"$key\":[^,}]*" "$2" | cut -d: -f2) |
    awk -v count="$count" 'BEGIN { bad = 0; n = 0 } { n++; d = $1 - $2; if (d < 0) d = -d;
         m = $1 < 0 ? -$1 : $1; if (d > 1e-5 * m) bad++ } END { exit (bad > 0 || n != count) }'
}

# same_weights A B: the largest per-tensor relative difference of runs A's and B's checkpoints is at most
# 1e-5 (lingtrain compare, its report in cmp.txt).
same_weights() {
  "$bin" compare --ckpt "$1/checkpoint" --vs "$2/checkpoint" >cmp.txt 2>&1 &&
    awk -F'"max_relative":' '{ split($2, v, ","); exit !(v[1] + 0 <= 1e-5) }' cmp.txt
}

# resumes_bit_for_bit RANKS RUN OUT FLAGS...: the caller's `common` run on RANKS ranks with FLAGS, stopped
# after step 3 into OUT and resumed there on its layout (with the caller's `resumed` flags), ends with the
# bytes of run RUN's checkpoint: the weights' file, and the optimizer's where RUN has one.
resumes_bit_for_bit() {
  local ranks=$1 run=$2 out=$3
  shift 3
  mpiexec -n "$ranks" "$bin" pretrain "${common[@]}" "$@" --stop-at 3 --out "$out" >/dev/null 2>&1 ||
    fail "$out: first half"
  mpiexec -n "$ranks" "$bin" pretrain --resume "$out/checkpoint" --out "$out" "${resumed[@]}" >/dev/null 2>"$out.err" ||
    fail "$out: resumed on its layout: $(tail -1 "$out.err")"
  local file
  for file in model optimizer; do
    [ "$file" = model ] || [ -e "$run/checkpoint/$file.safetensors" ] || continue
    cmp -s "$out/checkpoint/$file.safetensors" "$run/checkpoint/$file.safetensors" ||
      fail "$out: resumed on its layout: $file.safetensors differs from $run's"
  done
}

# post_training_like_one_process CKPT LABEL FLAGS...: SFT and DPO from CKPT on 2 ranks with FLAGS train what
# one process trains with 2 micro-batches: the losses and gradient norms agree to 1e-5, the weights too.
# SFT's packed rows hold different numbers of labelled tokens and DPO's different numbers of pairs, which
# weigh every rank's share as one process weighs its micro-batches (mean_loss_units); DPO's reference
# log-probs are computed once, by rank 0 with the whole reference model.
post_training_like_one_process() {
  local ckpt=$1 label=$2
  shift 2
  [ -d td ] || "$bin" tool-data --out td --sft 16 --dpo 16 --copy 8 >/dev/null || fail "tool-data"
  local kind
  for kind in sft dpo; do
    # (Enough rows that the 3 steps stay within the first epoch: 13 of SFT at 512, DPO's at 1024.)
    local seq=512
    [ $kind = dpo ] && seq=1024
    local post=(--ckpt "$ckpt" --data td/${kind}_train.jsonl --steps 3 --batch 1 --seq $seq --threads 1
      --eval-every 0 --sample-prompt "")
    local one=${kind}_one_$(echo "$ckpt" | tr / _) out=${kind}_$label
    [ -d "$one" ] || "$bin" $kind "${post[@]}" --accum 2 --out "$one" >/dev/null 2>"$one.err" ||
      fail "$kind, one process: $(tail -1 "$one.err")"
    mpiexec -n 2 "$bin" $kind "${post[@]}" "$@" --out "$out" >/dev/null 2>"$out.err" ||
      fail "$kind, $label: $(tail -1 "$out.err")"
    close "$one/metrics.jsonl" "$out/metrics.jsonl" lm_loss 3 || fail "$kind, $label: losses differ"
    close "$one/metrics.jsonl" "$out/metrics.jsonl" grad_norm 3 || fail "$kind, $label: gradient norms differ"
    same_weights "$one" "$out" || fail "$kind, $label: weights differ: $(cat cmp.txt)"
  done
}

# finish NAME: the closing line and the exit status.
finish() {
  if [ "$failures" -eq 0 ]; then echo "$1: all checks passed"; else echo "$1: $failures check(s) failed"; exit 1; fi
}
