#!/usr/bin/env bash
# The data path: shard sets (a glob, a list) read through memory maps, mixtures of weighted sources (the flag
# form and a recipe's list), each source's tokens in the metrics at its weight, a source that runs out
# repeating or ending the stage, resume continuing the exact stream mid-shard at another thread count and
# under mpiexec, a preset sized to its tokenizer's vocabulary, and the bad files' one-line errors.
# Usage: data_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

for i in $(seq 1 900); do
  echo "line $i: the quick brown fox $((i * 7 % 13)) jumps over $((i % 5)) lazy dogs."
done >web.txt
for i in $(seq 1 200); do echo "int f$i(int x) { return x * $i + $((i % 3)); }"; done >code.txt
"$bin" shards --out web/part --tokens-per-shard 5000 web.txt >/dev/null || fail "shards web"
"$bin" shards --out code/part --tokens-per-shard 3000 code.txt >/dev/null || fail "shards code"
[ "$(ls web | wc -l)" -ge 4 ] && [ "$(ls code | wc -l)" -ge 3 ] || fail "several shards per source: $(ls web code)"

json_number() { grep -o "\"$2\":[0-9.e+-]*" "$1" | tail -1 | cut -d: -f2; }
common=(--model tiny --seq 32 --batch 4 --threads 1 --sample-prompt "" --eval-every 0 --ckpt-every 0 --warmup-steps 2)

# A glob and a list of the same shards are the same data: the same run.
"$bin" pretrain "${common[@]}" --steps 4 --data 'web/part_*.bin' --val code/part_000000.bin --out glob >glob.txt 2>&1 ||
  fail "a glob: $(tail -1 glob.txt)"
grep -q "pretrain data web/part_\*.bin ($(ls web | wc -l) shards, [0-9]* tokens)" glob.txt ||
  fail "the first line names the shards: $(grep data glob.txt)"
list=$(ls web/part_*.bin | paste -sd,)
"$bin" pretrain "${common[@]}" --steps 4 --data "$list" --val code/part_000000.bin --out list >/dev/null 2>&1 ||
  fail "a list"
cmp -s glob/checkpoint/model.safetensors list/checkpoint/model.safetensors || fail "a glob and its list differ"

# A mixture: each source's share of the tokens within one window (32 tokens) of its weight at every step.
mix=(--data 'web@0.75=web/part_*.bin;code@0.25=code/part_*.bin')
"$bin" pretrain "${common[@]}" --steps 40 "${mix[@]}" --out mix >mix.txt 2>&1 || fail "a mixture: $(tail -1 mix.txt)"
grep -q "pretrain data web 0.75: web/part_\*.bin (.*); code 0.25: code/part_\*.bin" mix.txt ||
  fail "the first line names the sources: $(grep data mix.txt)"
grep '"sources"' mix/metrics.jsonl | grep -o '"code":{[^}]*},"web":{[^}]*}' | tr -c '0-9\n' ' ' |
  awk '{ n++; code = $2; web = $4; total = code + web;
         if (total != n * 128 || (code - 0.25 * total) > 32 || (0.25 * total - code) > 32) bad++ }
       END { exit (bad > 0 || n != 40) }' || fail "shares are not the weights: $(tail -2 mix/metrics.jsonl)"

# A recipe's list of sources is the same mixture.
cat >recipe.json <<'JSON'
{"model": "tiny", "seed": 1, "stages": [{"name": "mixed", "steps": 40, "seq": 32, "batch": 4, "warmup_steps": 2,
  "data": [{"name": "web", "path": "web/part_*.bin", "weight": 0.75},
           {"name": "code", "path": "code/part_*.bin", "weight": 0.25}]}]}
JSON
"$bin" pretrain --recipe recipe.json --threads 1 --sample-prompt "" --eval-every 0 --ckpt-every 0 --out recipe \
  >recipe.txt 2>&1 || fail "a recipe's mixture: $(tail -1 recipe.txt)"
cmp -s mix/checkpoint/model.safetensors recipe/checkpoint/model.safetensors || fail "the recipe's mixture differs"

# The code source (about 100 windows a pass) repeats, its epochs counted; with on_exhausted end the stage
# ends before code's second pass, its steps fitted (and its schedule with them).
"$bin" pretrain "${common[@]}" --steps 200 --batch 8 "${mix[@]}" --out repeat >/dev/null 2>&1 || fail "repeat"
[ "$(grep '"step":200,' repeat/metrics.jsonl | grep -o '"code":{"epoch":[0-9]*' | cut -d: -f3)" -ge 1 ] ||
  fail "code's epochs are not counted: $(grep '"step":200,' repeat/metrics.jsonl)"
"$bin" pretrain "${common[@]}" --steps 200 --batch 8 "${mix[@]}" --on-exhausted end --out end >end.txt 2>&1 ||
  fail "on_exhausted end: $(tail -1 end.txt)"
grep -q "stage 'pretrain': source 'code' runs out after [0-9]* steps (on_exhausted end); the stage ends there" \
  end.txt ||
  fail "no note of the end: $(head -2 end.txt)"
steps=$(json_number end/metrics.jsonl step)
[ "$steps" -gt 10 ] && [ "$steps" -lt 200 ] || fail "the stage ended at step $steps"
grep "\"step\":$steps," end/metrics.jsonl | grep -q '"code":{"epoch":0' || fail "code started another pass"

# Resume continues the exact stream mid-shard, at another thread count (the kernels' sums do not depend on
# it), and on 2 ranks under mpiexec.
"$bin" pretrain "${common[@]}" --steps 6 "${mix[@]}" --out whole >/dev/null 2>&1 || fail "whole"
common+=(--steps 6 "${mix[@]}")
resumed=(--sample-prompt "" --eval-every 0 --ckpt-every 0 --threads 2)
resumes_bit_for_bit 1 whole resumed1
# (Rank r takes the rows one process takes as its micro-batch r: the same shapes, so the same sums.)
"$bin" pretrain "${common[@]}" --batch 2 --accum 2 --out accum >/dev/null 2>&1 || fail "2 micro-batches"
mpiexec -n 2 "$bin" pretrain "${common[@]}" --batch 2 --out two >two.txt 2>&1 || fail "2 ranks: $(tail -1 two.txt)"
grep -q '"world_size":2' two.txt || fail "not 2 ranks: $(tail -1 two.txt)"
close accum/metrics.jsonl two/metrics.jsonl || fail "2 ranks of 2 rows take other windows than 2 micro-batches"
resumed=(--sample-prompt "" --eval-every 0 --ckpt-every 0 --threads 1)
resumes_bit_for_bit 2 two resumed2 --batch 2
sources_of() { grep -o '"sources":{[^}]*}[^}]*}' "$1/metrics.jsonl"; }
diff <(sources_of two) <(sources_of resumed2) >/dev/null || fail "the resumed run's source counts differ"

# A preset follows its tokenizer: a 400-token BPE with tiny (320) makes a 448-row table.
syllables=(ka lo mi ne ru sa te vi zo pa qu bre stra fli gon dur wex yal hob cim)
for i in $(seq 1 3000); do
  word="${syllables[$((i % 20))]}${syllables[$((i * 7 % 20))]}${syllables[$((i * 13 % 19))]}"
  echo "$word ${syllables[$((i / 20 % 20))]}."
done >words.txt
"$bin" tokenizer train --vocab 400 --out bpe.json words.txt >bpe.txt || fail "tokenizer"
grep -q '"vocab_size":400' bpe.txt || fail "the tokenizer has $(cat bpe.txt)"
"$bin" shards --tokenizer bpe.json --out bpe/part words.txt >/dev/null || fail "bpe shards"
"$bin" pretrain --model tiny --tokenizer bpe.json --data bpe/part_000000.bin --steps 2 --seq 32 --batch 2 \
  --threads 1 --sample-prompt "" --out bpe_run >bpe_run.txt 2>&1 || fail "tiny with 400 tokens: $(tail -1 bpe_run.txt)"
grep -q "^model tiny: .*; vocab_size 448 (the tokenizer's [0-9]* tokens rounded up to 64; the preset's is 320)" \
  bpe_run.txt || fail "the model's line does not say the vocabulary: $(grep '^model' bpe_run.txt)"
grep -q '"vocab_size": *448' bpe_run/checkpoint/config.json || fail "the checkpoint's vocab_size"

# Bad files: one line naming the file. (wide.bin: a uint32 shard of 40 tokens, all 0.)
{ printf '\xa1\xd9\x34\x01\x07\x00\x00\x00\x28\x00\x00\x00'; head -c $((1012 + 160)) /dev/zero; } >wide.bin
expect_error "uint16 and uint32 shards" "wide.bin: holds uint32 tokens, but web/part_000000.bin holds uint16" \
  "$bin" pretrain "${common[@]}" --data web/part_000000.bin,wide.bin --out bad
printf 'x' | cat web/part_000000.bin - >truncated.bin
head -c 2000 web/part_000000.bin >short.bin
expect_error "a truncated shard" "short.bin: header says [0-9]* tokens .* (truncated)" \
  "$bin" pretrain "${common[@]}" --data short.bin --out bad
expect_error "a shard with a byte too many" "truncated.bin: header says" \
  "$bin" pretrain "${common[@]}" --data truncated.bin --out bad
expect_error "no match" "nothing/\*.bin: no file matches" \
  "$bin" pretrain "${common[@]}" --data 'nothing/*.bin' --out bad
expect_error "a bad weight" "source 'web': weight 'x' is not a number" \
  "$bin" pretrain "${common[@]}" --data 'web@x=web/part_*.bin;code@1=code/part_*.bin' --out bad
expect_error "on_exhausted" "on_exhausted must be repeat or end" \
  "$bin" pretrain "${common[@]}" --on-exhausted stop --out bad
[ ! -e bad ] || fail "a run that failed on its data left $(ls bad)"

finish data_test
