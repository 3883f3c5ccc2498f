#!/usr/bin/env bash
# lingtrain inspect and report from the command line: the routing table (plain into a file, coloured on
# a terminal), its JSON lines, --vs between two checkpoints, --data from a shard, --by-domain with the
# embedded domains and with --domain files, the report file, and one clear error line for bad input.
# Usage: inspect_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

run=(--model tiny --batch 4 --seq 64 --eval-every 0 --sample-prompt "" --threads 1)
"$bin" pretrain "${run[@]}" --steps 3 --out early >/dev/null 2>early.err || fail "early run: $(tail -1 early.err)"
"$bin" pretrain "${run[@]}" --steps 40 --out late >/dev/null 2>late.err || fail "late run: $(tail -1 late.err)"

text="int f(int x) { return x; }"  # 26 bytes: 26 tokens of the byte tokenizer
"$bin" inspect --ckpt late/checkpoint --text "$text" >table.txt 2>err.txt || fail "inspect: $(cat err.txt)"
grep -q $'\x1b' table.txt && fail "inspect into a file: colour escapes in the output"
grep -q '│ layer 1 .*│ layer 2 .*│ layer 3' table.txt || fail "inspect: no layer 1..3 columns: $(head -3 table.txt)"
[ "$(grep -cE '^ *[0-9]+  ' table.txt)" -ge 26 ] || fail "inspect: fewer than 26 token rows"
grep -q '^per MoE layer' table.txt || fail "inspect: no per-layer totals"
# On a terminal: colour (each expert its own).
if command -v script >/dev/null; then
  script -qec "'$bin' inspect --ckpt late/checkpoint --text 'ab'" /dev/null >tty.txt 2>&1 || fail "inspect on a terminal"
  grep -q $'\x1b\[38;5;' tty.txt || fail "inspect on a terminal: no colour"
fi

"$bin" inspect --ckpt late/checkpoint --text "$text" --json >lines.jsonl 2>err.txt || fail "inspect --json: $(cat err.txt)"
[ "$(grep -c '"type":"token"' lines.jsonl)" = 26 ] || fail "inspect --json: not 26 token lines"
[ "$(grep -c '"type":"layer"' lines.jsonl)" = 3 ] || fail "inspect --json: not 3 layer lines"
# A token line: for each layer, 2 experts, 2 gate weights summing to 1, the entropy and z.
awk -F'"weights":\\[' 'NR <= 26 { for (i = 2; i <= NF; ++i) { split($i, w, /[],]/); s = w[1] + w[2];
  if (s < 0.999 || s > 1.001) bad = 1 } } END { exit bad }' lines.jsonl || fail "inspect --json: gates do not sum to 1"
grep -q '"text":"i"' lines.jsonl || fail "inspect --json: the first token's text is missing"
grep '"type":"layer"' lines.jsonl | grep -q '"load":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*\]' || fail "inspect --json: no load per expert"

"$bin" inspect --ckpt late/checkpoint --vs late/checkpoint --text "$text" --json >same.jsonl 2>err.txt || fail "--vs itself: $(cat err.txt)"
[ "$(grep -c '"top1_changed":0.0' same.jsonl)" = 3 ] || fail "--vs itself: top-1 changed is not 0 in every layer"
"$bin" inspect --ckpt late/checkpoint --vs early/checkpoint --text "$text" >vs.txt 2>err.txt || fail "--vs: $(cat err.txt)"
grep -q 'top-1 changed' vs.txt || fail "--vs: no top-1 column"
"$bin" inspect --ckpt late/checkpoint --vs early/checkpoint --text "$text" --json | grep -o '"top1_changed":[0-9.e-]*' |
  awk -F: '$2 > 0 { n++ } END { exit n == 0 }' || fail "--vs: 37 steps of training changed no top-1 expert"

"$bin" inspect --ckpt late/checkpoint --data late/data/val.bin --tokens 10 --offset 5 --json >shard.jsonl 2>err.txt ||
  fail "inspect --data: $(cat err.txt)"
[ "$(grep -c '"type":"token"' shard.jsonl)" = 10 ] || fail "inspect --data --tokens 10: not 10 tokens"

"$bin" inspect --ckpt late/checkpoint --by-domain --domain-tokens 512 --json >domains.jsonl 2>err.txt ||
  fail "--by-domain: $(cat err.txt)"
[ "$(grep -c '"mutual_information_bits"' domains.jsonl)" = 3 ] || fail "--by-domain: not one line per MoE layer"
grep -q '"domains":\["prose","arithmetic","code","records","conlang"\]' domains.jsonl || fail "--by-domain: not the 5 domains"
grep -q '"max_mutual_information_bits":2.0' domains.jsonl || fail "--by-domain: the maximum is not min(log2 5, log2(8/2)) = 2"
"$bin" inspect --ckpt late/checkpoint --by-domain --domain-tokens 512 >domains.txt 2>err.txt || fail "--by-domain table"
grep -q 'layer 1: I(domain; expert) = [0-9.]* bits of at most 2.000' domains.txt || fail "--by-domain: no MI line"
printf 'the cat sat on the mat. %.0s' $(seq 30) >words.txt
printf '{"a": 1, "b": [2, 3]}\n%.0s' $(seq 30) >records.txt
"$bin" inspect --ckpt late/checkpoint --domain words=words.txt --domain json=records.txt --domain-tokens 500 --json >mine.jsonl 2>err.txt ||
  fail "--domain: $(cat err.txt)"
grep -q '"domains":\["words","json"\]' mine.jsonl || fail "--domain: not the two named domains"
grep -q '"domain_tokens":\[500,500\]' mine.jsonl || fail "--domain-tokens 500: the domains are not cut to 500 tokens"
grep -q '"max_mutual_information_bits":1.0' mine.jsonl || fail "--domain: two equal domains give a maximum of 1 bit"
"$bin" inspect --ckpt late/checkpoint --domain words=words.txt --domain-tokens 200 >one.txt 2>err.txt || fail "one --domain: $(cat err.txt)"
grep -q '^routing of 1 domain (' one.txt || fail "one --domain: not '1 domain': $(head -1 one.txt)"

"$bin" report --run late --domain-tokens 256 >report.txt 2>err.txt || fail "report: $(cat err.txt)"
[ -s late/report.html ] || fail "report: no late/report.html"
"$bin" report --run late --out elsewhere.html --domain words=words.txt --domain json=records.txt >/dev/null 2>&1 ||
  fail "report --out --domain"
grep -q '2 domains given with --domain' elsewhere.html || fail "report --domain: not measured on the given domains"

# Post-training runs at seq 512 on the 256-position tiny model (the stage extends the context, so the
# run's starting weights route in a longer window than their config allows): each report names its own
# loss, describes no routing warmup, and DPO's shows its held-out rewards.
"$bin" tool-data --out td --sft 40 --dpo 10 --copy 40 >/dev/null || fail "tool-data"
post=(--seq 512 --batch 2 --steps 2 --eval-every 1 --threads 1)
"$bin" sft --ckpt late/checkpoint --data td/sft_train.jsonl --val td/sft_val.jsonl "${post[@]}" --out sft >/dev/null 2>sft.err ||
  fail "sft: $(tail -1 sft.err)"
"$bin" dpo --ckpt sft/checkpoint --data td/dpo_train.jsonl --val td/dpo_val.jsonl --beta 0.5 --rpo-alpha 10 "${post[@]}" \
  --out dpo >/dev/null 2>dpo.err || fail "dpo: $(tail -1 dpo.err)"
"$bin" report --run sft --domain-tokens 256 >/dev/null 2>err.txt || fail "report of an sft run at seq 512: $(cat err.txt)"
"$bin" report --run dpo --domain-tokens 256 >/dev/null 2>err.txt || fail "report of a dpo run at seq 512: $(cat err.txt)"
for kind in sft dpo; do
  grep -q 'next-token' $kind/report.html && fail "report of the $kind run: its loss is called next-token cross-entropy"
  grep -q 'routing warmup keeps' $kind/report.html && fail "report of the $kind run: a routing warmup it did not have"
  grep -q 'smoothed' $kind/report.html && fail "report of the $kind run: a 2-step run's loss called smoothed"
  grep -q '<th>before the run ([^)]*/checkpoint)</th>' $kind/report.html ||
    fail "report of the $kind run: no specialisation of the starting checkpoint"
done
grep -q "The loss is the mean cross-entropy of the assistant's tokens" sft/report.html || fail "report of the sft run: not its loss"
grep -q 'The loss is the DPO loss: sigmoid DPO' dpo/report.html || fail "report of the dpo run: not its loss"
grep -q 'rpo_alpha = 10 times' dpo/report.html || fail "report of the dpo run: not its rpo_alpha"
grep -q '<th>held-out reward accuracy</th><td>[0-9.]*% of pairs at step [12].*before training)</td>' dpo/report.html ||
  fail "report of the dpo run: no held-out reward accuracy"
grep -q '>Reward accuracy<' dpo/report.html || fail "report of the dpo run: no reward accuracy chart"
# The extended checkpoint against the one it started from, routed in the same 512-token windows.
"$bin" inspect --ckpt sft/checkpoint --vs late/checkpoint --text "hello there" >vs.txt 2>err.txt ||
  fail "inspect --vs a shorter-context checkpoint: $(cat err.txt)"
grep -q "top-1 changed" vs.txt || fail "inspect --vs a shorter-context checkpoint: no top-1 changes"

expect_error "inspect without a checkpoint" "inspect needs --ckpt" "$bin" inspect --text hi
expect_error "inspect without text" "one of --text TEXT, --data" "$bin" inspect --ckpt late/checkpoint
expect_error "inspect with text and data" "one of --text TEXT, --data" "$bin" inspect --ckpt late/checkpoint --text a --data late/data/val.bin
expect_error "inspect of a missing checkpoint" "nowhere" "$bin" inspect --ckpt nowhere --text hi
expect_error "inspect --vs a missing checkpoint" "nowhere" "$bin" inspect --ckpt late/checkpoint --vs nowhere --text hi
expect_error "inspect --offset past the end" "flag --offset" "$bin" inspect --ckpt late/checkpoint --data late/data/val.bin --offset 999999999
expect_error "a --domain without a file" "NAME=FILE" "$bin" inspect --ckpt late/checkpoint --domain words
expect_error "a --domain file that is missing" "missing.txt" "$bin" inspect --ckpt late/checkpoint --domain w=missing.txt
expect_error "--by-domain with --text" "takes no --text" "$bin" inspect --ckpt late/checkpoint --by-domain --text hi
expect_error "a report without --run" "report needs --run" "$bin" report
expect_error "a report of a missing run" "nowhere" "$bin" report --run nowhere
mkdir -p empty/checkpoint
expect_error "a report of a run with no metrics" "metrics.jsonl" "$bin" report --run empty
finish inspect_test
