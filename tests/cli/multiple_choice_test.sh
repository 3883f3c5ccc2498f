#!/usr/bin/env bash
# lingtrain mc-data and eval-mc from the command line: the embedded task's file (deterministic, seeded),
# eval-mc's last line (JSON: acc and acc_norm in [0, 1], n, chance, truncated, shots) and progress line,
# --limit, few-shot runs from the same file and from --fewshot with their truncations counted, HellaSwag
# items, --scores, and one clear error line naming the file and the line for each kind of bad item; then
# the accuracy as a run trains (--eval-mc), on one process and under mpiexec.
# Usage: multiple_choice_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

"$bin" pretrain --model tiny --batch 4 --seq 64 --steps 3 --eval-every 0 --sample-prompt "" --threads 1 --out run \
  >/dev/null 2>run.err || fail "pretrain: $(tail -1 run.err)"
eval_mc=("$bin" eval-mc --ckpt run/checkpoint --threads 1)

"$bin" mc-data --out mc.jsonl --items 40 >/dev/null 2>err.txt || fail "mc-data: $(cat err.txt)"
[ "$(wc -l <mc.jsonl)" = 40 ] || fail "mc-data: not 40 lines"
"$bin" mc-data --out again.jsonl --items 40 >/dev/null && cmp -s mc.jsonl again.jsonl ||
  fail "mc-data: not deterministic"
"$bin" mc-data --out seed2.jsonl --items 40 --seed 2 >/dev/null && ! cmp -s mc.jsonl seed2.jsonl ||
  fail "mc-data: --seed changes nothing"

# field NAME: the value of NAME in the last line of out.txt.
field() { tail -1 out.txt | grep -o "\"$1\":[^,}]*" | cut -d: -f2; }

"${eval_mc[@]}" --data mc.jsonl --scores scores.jsonl >out.txt 2>err.txt || fail "eval-mc: $(tail -1 err.txt)"
tail -1 out.txt | grep -q '^{.*}$' || fail "eval-mc: the last line is not a JSON object: $(tail -1 out.txt)"
awk -v a="$(field acc)" -v b="$(field acc_norm)" 'BEGIN { exit !(a >= 0 && a <= 1 && b >= 0 && b <= 1) }' ||
  fail "eval-mc: acc or acc_norm outside [0, 1]: $(tail -1 out.txt)"
[ "$(field n)" = 40 ] || fail "eval-mc: n is not 40: $(tail -1 out.txt)"
[ "$(field chance)" = 0.25 ] || fail "eval-mc: chance is not 0.25: $(tail -1 out.txt)"
[ "$(field truncated)" = 0 ] && [ "$(field shots)" = 0 ] || fail "eval-mc: truncated or shots not 0: $(tail -1 out.txt)"
grep -q 'eval-mc: 40/40 items, acc ' err.txt || fail "eval-mc: no progress line: $(cat err.txt)"
[ "$(grep -c '"logprobs":\[[^],]*,[^],]*,[^],]*,[^],]*\]' scores.jsonl)" = 40 ] ||
  fail "--scores: not 40 lines of 4 log-probs"

"${eval_mc[@]}" --data mc.jsonl --limit 10 >out.txt 2>err.txt || fail "--limit: $(tail -1 err.txt)"
[ "$(field n)" = 10 ] || fail "--limit 10: n is not 10: $(tail -1 out.txt)"

# One solved example doubles a prompt, past the tiny model's 256 positions: every item is truncated.
"${eval_mc[@]}" --data mc.jsonl --limit 10 --shots 1 >out.txt 2>err.txt || fail "--shots 1: $(tail -1 err.txt)"
[ "$(field truncated)" = 10 ] && [ "$(field shots)" = 1 ] || fail "--shots 1: not 10 truncated: $(tail -1 out.txt)"
"${eval_mc[@]}" --data mc.jsonl --limit 5 --shots 2 --fewshot seed2.jsonl >out.txt 2>err.txt ||
  fail "--fewshot: $(tail -1 err.txt)"
[ "$(field n)" = 5 ] && [ "$(field truncated)" = 5 ] || fail "--fewshot: $(tail -1 out.txt)"

{
  printf '%s' '{"activity_label": "Cooking", "ctx_a": "A man cuts onions.", "ctx_b": "he", "label": "0", '
  echo '"endings": ["cries.", "flies [title] away.", "sings.", "runs."]}'
  echo '{"ctx": "She opens the door and", "endings": ["walks in.", "eats it."], "label": 1}'
} >hellaswag.jsonl
"${eval_mc[@]}" --data hellaswag.jsonl >out.txt 2>err.txt || fail "HellaSwag items: $(tail -1 err.txt)"
[ "$(field n)" = 2 ] && [ "$(field chance)" = 0.375 ] || fail "HellaSwag items: $(tail -1 out.txt)"

good='{"context": "a", "choices": ["b", "c"], "label": 0}'
bad_item() { printf '%s\n%s\n' "$good" "$2" >"$1.jsonl"; }
bad_item no_label '{"context": "a", "choices": ["b", "c"]}'
bad_item out_of_range '{"context": "a", "choices": ["b", "c"], "label": 2}'
bad_item empty_choice '{"context": "a", "choices": ["b", ""], "label": 0}'
bad_item no_choices '{"context": "a", "label": 0}'
bad_item not_json '{"context": "a", "choices": ["b"'
expect_error "no label" "no_label.jsonl:2: no label" "${eval_mc[@]}" --data no_label.jsonl
expect_error "label out of range" "out_of_range.jsonl:2: label 2 is out of range" \
  "${eval_mc[@]}" --data out_of_range.jsonl
expect_error "empty choice" "empty_choice.jsonl:2: choice 1 is empty" "${eval_mc[@]}" --data empty_choice.jsonl
expect_error "no choices" "no_choices.jsonl:2: no choices" "${eval_mc[@]}" --data no_choices.jsonl
expect_error "not JSON" "not_json.jsonl:2: invalid JSON" "${eval_mc[@]}" --data not_json.jsonl
expect_error "bad few-shot file" "no_label.jsonl:2: no label" \
  "${eval_mc[@]}" --data mc.jsonl --shots 1 --fewshot no_label.jsonl
expect_error "too few examples" "too few to draw 3 examples" "${eval_mc[@]}" --data hellaswag.jsonl --shots 3
expect_error "missing file" "missing.jsonl" "${eval_mc[@]}" --data missing.jsonl

# During training (--eval-mc): records at the --eval-mc-every points and at the end, the progress line, the
# summary, the report's chart; the run trains the same weights as without; a bad file stops it with nothing
# written; SFT scores before its first step. Under mpiexec the ranks whose forwards are collective (expert
# parallelism, parameter sharding) score together, and the figures are one process's.
train=(--model tiny --batch 2 --seq 64 --steps 4 --eval-every 0 --sample-prompt "" --threads 1 --routing-warmup 2)
"$bin" pretrain "${train[@]}" --eval-mc mc.jsonl --eval-mc-items 12 --eval-mc-every 2 --out with >with.txt 2>&1 ||
  fail "pretrain --eval-mc: $(tail -1 with.txt)"
# (Step 2's, and the end's: the last step's figures are the end's.)
[ "$(grep -c '"mc_acc":' with/metrics.jsonl)" = 2 ] || fail "--eval-mc-every 2: not 2 records (step 2, the end)"
grep -q '"mc_chance":0.25,"mc_items":12,"mc_truncated":0' with/metrics.jsonl || fail "the records' figures"
grep -q "^step 2: multiple-choice acc [0-9.]*, acc_norm [0-9.]* (12 items, chance 0.2500)" with.txt ||
  fail "no progress line: $(grep -i multiple with.txt)"
grep -q "^multiple-choice accuracy (12 items of mc.jsonl): acc" with.txt || fail "no final line"
tail -1 with.txt | grep -q '"mc_acc":' || fail "the summary has no mc_acc"
"$bin" pretrain "${train[@]}" --out without >/dev/null 2>&1 || fail "pretrain without --eval-mc"
cmp -s with/checkpoint/model.safetensors without/checkpoint/model.safetensors || fail "--eval-mc changed the weights"
"$bin" report --run with >/dev/null && grep -q "Multiple-choice accuracy" with/report.html ||
  fail "the report has no multiple-choice chart"
expect_error "a bad --eval-mc file" "no_label.jsonl:2: no label" \
  "$bin" pretrain "${train[@]}" --eval-mc no_label.jsonl --out refused
[ -e refused ] && fail "a run refused for its --eval-mc file left its folder"
[ -d td ] || "$bin" tool-data --out td --sft 16 --dpo 5 --copy 5 >/dev/null || fail "tool-data"
"$bin" sft --ckpt with/checkpoint --data td/sft_train.jsonl --steps 1 --batch 1 --threads 1 --eval-every 1 \
  --eval-mc embedded --eval-mc-items 8 --out sft >sft.txt 2>&1 || fail "sft --eval-mc: $(tail -1 sft.txt)"
grep -q "^step 0: multiple-choice acc [0-9.]* before sft" sft.txt || fail "sft: no accuracy before: $(head -3 sft.txt)"

train+=(--eval-mc mc.jsonl --eval-mc-items 12 --eval-mc-every 2)
"$bin" pretrain "${train[@]}" --batch 1 --accum 2 --out one >/dev/null 2>&1 || fail "one process, 2 micro-batches"
for layout in "--expert-parallel 2" "--shard-params on"; do
  out=$(echo "$layout" | tr -d ' -')
  mpiexec -n 2 "$bin" pretrain "${train[@]}" --batch 1 $layout --out "$out" >"$out.txt" 2>&1 ||
    fail "$layout: $(tail -1 "$out.txt")"
  grep -q '"world_size":2' "$out.txt" || fail "$layout: not 2 ranks"
  close one/metrics.jsonl "$out/metrics.jsonl" mc_acc 2 || fail "$layout: accuracies differ from one process's"
done

finish "multiple choice"
