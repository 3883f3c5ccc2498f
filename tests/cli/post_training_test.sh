#!/usr/bin/env bash
# The post-training commands: a BPE tokenizer trained, used to encode, to make shards and to pre-train
# (the checkpoint carries its tokenizer.json, sample and resume use it); Ling's chat template; score; the
# embedded tool-use data; SFT and DPO runs (resume, metrics, the reference cache); and the refusals: a
# tokenizer too large for the model, another tokenizer on resume, a tokenizer.json of another kind.
# Usage: post_training_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

for i in $(seq 1 300); do
  echo "the $((i % 17)) quick brown foxes jump over $((i * 7)) lazy dogs; it's line $i of $((i % 5 + 1)) pages."
  echo "Über ${i}: größer — café, naïve; Привет мир $i; { return x * $i; } // why? because."
done >text.txt
"$bin" tokenizer train --vocab 300 --out tok.json text.txt >train.out || fail "tokenizer train"
grep -q '"vocab_size":300' train.out || fail "tokenizer train: $(cat train.out)"
"$bin" tokenizer train --vocab 300 --out tok2.json text.txt >/dev/null && cmp -s tok.json tok2.json ||
  fail "tokenizer train is not deterministic"

# Encode: fewer ids than bytes (34); the special token's spelling is one id only with --special 1.
"$bin" tokenizer encode --tokenizer tok.json "the quick brown foxes<|endoftext|>" >plain.out || fail "encode"
"$bin" tokenizer encode --tokenizer tok.json --special 1 "the quick brown foxes<|endoftext|>" >special.out ||
  fail "encode --special"
plain_ids=$(grep -o '"ids":\[[0-9,]*\]' plain.out | grep -o '[0-9]\+' | wc -l)
special_ids=$(grep -o '"ids":\[[0-9,]*\]' special.out | grep -o '[0-9]\+' | wc -l)
[ "$plain_ids" -lt 30 ] && [ "$special_ids" -lt "$plain_ids" ] ||
  fail "encode: $plain_ids plain ids for 34 bytes, $special_ids with special tokens (want < 30, and fewer)"
grep -q ',297\]' special.out || fail "encode --special: <|endoftext|> is not id 297: $(cat special.out)"

# Shards with the tokenizer, then pre-training on them: the checkpoint keeps the tokenizer.
"$bin" shards --tokenizer tok.json --out data/train text.txt >/dev/null || fail "shards --tokenizer"
run=(--data data/train_000000.bin --val data/train_000000.bin --seq 32 --batch 2 --threads 1 --eval-every 0)
"$bin" pretrain "${run[@]}" --tokenizer tok.json --steps 6 --out run --sample-prompt "the " --sample-tokens 5 \
  >run.out 2>&1 || fail "pretrain --tokenizer: $(tail -1 run.out)"
cmp -s tok.json run/checkpoint/tokenizer.json || fail "the checkpoint does not carry the run's tokenizer.json"
"$bin" sample --ckpt run/checkpoint --prompt "the quick" --tokens 8 --threads 1 >sample.out || fail "sample"
grep -q '^the quick' sample.out || fail "sample: $(cat sample.out)"
# --n 3: three continuations decoded together, each under its header; the first is --n 1's (row 0 draws
# from the seed itself).
"$bin" sample --ckpt run/checkpoint --prompt "the quick" --tokens 8 --threads 1 --n 3 >sample3.out ||
  fail "sample --n 3"
[ "$(grep -c '^=== sample [1-3] of 3 ===$' sample3.out)" = 3 ] || fail "sample --n 3: $(cat sample3.out)"
[ "$(sed -n '2,/^=== sample 2 of 3 ===$/p' sample3.out | sed '$d')" = "$(cat sample.out)" ] ||
  fail "sample --n 3: the first continuation is not --n 1's: $(cat sample3.out) vs $(cat sample.out)"
expect_error "sample --n 0" "flag --n must be > 0" "$bin" sample --ckpt run/checkpoint --prompt hi --n 0
"$bin" pretrain --resume run/checkpoint --steps 8 --threads 1 --eval-every 0 --sample-prompt "" >/dev/null 2>&1 ||
  fail "resume of a BPE run"
cmp -s tok.json run/checkpoint/tokenizer.json || fail "the resumed checkpoint lost its tokenizer.json"

# Ling's chat template: one JSON line per record, with the BPE tokenizer and the byte tokenizer.
conversations=$(dirname "$0")/../golden/chat/conversations.jsonl
for tok in tok.json ""; do
  "$bin" chat-template --data "$conversations" ${tok:+--tokenizer $tok} >chat.out || fail "chat-template ${tok:-(bytes)}"
  [ "$(grep -c '^{"ids":\[.*\],"loss_mask":\[.*\],"text":".*"}$' chat.out)" = 7 ] ||
    fail "chat-template ${tok:-(bytes)}: $(head -c 300 chat.out)"
done
# score: the log-probability of what chat-template marks, per record, with the checkpoint's tokenizer.
head -2 "$conversations" >two.jsonl
"$bin" score --ckpt run/checkpoint --data two.jsonl --threads 1 >score.out || fail "score"
[ "$(grep -c '^{"logp":-[0-9.e+-]*,"tokens":[1-9][0-9]*}$' score.out)" = 2 ] || fail "score: $(cat score.out)"
# A record longer than the model (or --seq) is skipped and counted, as sft's packing does; the lines stay
# one per record.
long=$(printf 'x%.0s' $(seq 1 3000))
{ head -1 "$conversations"; echo "{\"prompt\": \"long\", \"completion\": \"$long\"}"; } >long.jsonl
"$bin" score --ckpt run/checkpoint --data long.jsonl --threads 1 >score.out 2>score.err ||
  fail "score, a record longer than the model: $(cat score.err)"
[ "$(grep -c '^{"logp":-[0-9.e+-]*,"tokens":[1-9][0-9]*}$' score.out)" = 1 ] &&
  [ "$(grep -c '^{"length":[0-9]*,"skipped":"longer than --seq [0-9]* + 1"}$' score.out)" = 1 ] ||
  fail "score, a record longer than the model: $(head -c 300 score.out)"
grep -q '^long.jsonl: 1 of 2 records longer than --seq [0-9]* + 1 skipped$' score.err || fail "score: no skip count: $(cat score.err)"
"$bin" score --ckpt run/checkpoint --data two.jsonl --seq 4 --threads 1 >score.out 2>score.err || fail "score --seq 4"
[ "$(grep -c '"skipped":"longer than --seq 4 + 1"' score.out)" = 2 ] && grep -q '2 of 2 records' score.err ||
  fail "score --seq 4: $(cat score.out score.err)"
expect_error "score, --seq beyond the model" "flag --seq 100000 exceeds max_position_embeddings" \
  "$bin" score --ckpt run/checkpoint --data two.jsonl --seq 100000
printf '{"prompt": "a", "completion": "b"}\n{"messages": [{"role": "wizard", "content": "x"}]}\n' >bad.jsonl
expect_error "chat-template, unknown role" "bad.jsonl:2: messages\[0\]: unknown role 'wizard'" \
  "$bin" chat-template --data bad.jsonl

# The embedded tool-use data renders through the chat template.
"$bin" tool-data --out td --sft 40 --dpo 10 --copy 40 >td.out || fail "tool-data"
grep -q '"sft_train.jsonl":40' td.out && grep -q '"copy_train.jsonl":40' td.out || fail "tool-data: $(cat td.out)"
[ "$("$bin" chat-template --data td/sft_val.jsonl | wc -l)" = 8 ] || fail "tool-data: sft_val does not render"
# eval-tools plays 8 of them (an untrained model: the figures are low, the accounting must add up).
"$bin" eval-tools --ckpt run/checkpoint --data td/sft_val.jsonl --limit 8 --max-tokens 16 --threads 1 >tools.out ||
  fail "eval-tools"
played=$(grep -o '"conversations":[0-9]*' tools.out | cut -d: -f2)
skipped=$(grep -o '"skipped_without_tool":[0-9]*' tools.out | cut -d: -f2)
[ "$((played + skipped))" = 8 ] || fail "eval-tools: conversations + skipped != 8: $(cat tools.out)"
for key in tool_call_exact_match format_validity final_answer_accuracy expected_calls; do
  grep -q "\"$key\":" tools.out || fail "eval-tools: no $key in $(cat tools.out)"
done
# The replies decoded one conversation at a time: the same figures (greedy).
"$bin" eval-tools --ckpt run/checkpoint --data td/sft_val.jsonl --limit 8 --max-tokens 16 --threads 1 --batch 1 \
  >tools1.out || fail "eval-tools --batch 1"
cmp -s tools.out tools1.out || fail "eval-tools --batch 1 differs: $(cat tools1.out) vs $(cat tools.out)"
expect_error "eval-tools --batch 0" "flag --batch must be > 0" \
  "$bin" eval-tools --ckpt run/checkpoint --data td/sft_val.jsonl --batch 0

mkdir -p nograph && cp td/sft_val.jsonl nograph/
expect_error "eval-tools without its graph" "no knowledge graph at nograph/knowledge_graph.json .*pass --graph" \
  "$bin" eval-tools --ckpt run/checkpoint --data nograph/sft_val.jsonl --threads 1

# SFT from the BPE checkpoint: held-out loss before and during, the tokenizer carried on, and a run
# stopped and resumed equal to a straight one byte for byte.
sft=(--ckpt run/checkpoint --data td/sft_train.jsonl --val td/sft_val.jsonl --seq 384 --batch 2 --threads 1
     --eval-every 2 --aux-loss-coef 0.01)
"$bin" sft "${sft[@]}" --steps 4 --out sft >sft.out 2>&1 || fail "sft: $(tail -1 sft.out)"
grep -q "held-out loss [0-9.]* before sft" sft.out || fail "sft: no held-out loss before training: $(head -5 sft.out)"
[ "$(grep -c '"val_loss"' sft/metrics.jsonl)" -ge 2 ] || fail "sft: held-out loss missing from metrics"
grep -q '"aux_loss":[0-9]' sft/metrics.jsonl || fail "sft: the MoE auxiliary loss is not logged"
grep -q '"aux_loss_coef": *0.01' sft/checkpoint/config.json || fail "sft: --aux-loss-coef did not reach the model"
cmp -s tok.json sft/checkpoint/tokenizer.json || fail "sft: the checkpoint lost the tokenizer"
"$bin" sft "${sft[@]}" --steps 4 --stop-at 2 --out sft2 >/dev/null 2>&1 || fail "sft --stop-at"
"$bin" sft --resume sft2/checkpoint --threads 1 >/dev/null 2>&1 || fail "sft --resume"
cmp -s sft/checkpoint/model.safetensors sft2/checkpoint/model.safetensors ||
  fail "an SFT run stopped at step 2 and resumed differs from a straight one"

# DPO from the SFT checkpoint: TRL's metrics in the log and for the held-out pairs, the first step at
# the reference (margins 0), and the reference log-probs cached and reused by a rerun.
dpo=(--ckpt sft/checkpoint --data td/dpo_train.jsonl --val td/dpo_val.jsonl --seq 768 --batch 2 --threads 1
     --eval-every 2)
"$bin" dpo "${dpo[@]}" --steps 3 --out dpo >dpo.out 2>&1 || fail "dpo: $(tail -1 dpo.out)"
grep -q "computed with the reference checkpoint" dpo.out || fail "dpo: reference log-probs not computed: $(head -5 dpo.out)"
for key in rewards/chosen rewards/rejected rewards/accuracies rewards/margins logps/chosen logps/rejected nll_loss; do
  grep -q "\"$key\":" dpo/metrics.jsonl || fail "dpo: no $key in the metrics"
  grep -q "\"eval_$key\":" dpo/metrics.jsonl || fail "dpo: no eval_$key in the metrics"
done
margin=$(grep '"step":1,' dpo/metrics.jsonl | grep -o '"rewards/margins":[-0-9.e]*' | cut -d: -f2)
awk -v m="$margin" 'BEGIN { exit !(m != "" && m < 1e-6 && m > -1e-6) }' ||
  fail "dpo: the first step is not at the reference (rewards/margins $margin)"
"$bin" dpo "${dpo[@]}" --steps 1 --out dpo >dpo2.out 2>&1 || fail "dpo rerun"
[ "$(grep -c 'reused from' dpo2.out)" = 2 ] || fail "dpo: a rerun did not reuse the cached log-probs: $(head -4 dpo2.out)"

# Post-training refusals and counted skips.
printf '{"prompt": "p", "chosen": "same", "rejected": "same"}\n' >identical.jsonl
expect_error "dpo, only identical pairs" "identical.jsonl: no pair to train on (1 records, 0 longer .* 1 with identical" \
  "$bin" dpo --ckpt sft/checkpoint --data identical.jsonl --steps 1 --out refused
expect_error "dpo, a held-out file of identical pairs" "identical.jsonl: no pair to evaluate on (1 records" \
  "$bin" dpo --ckpt sft/checkpoint --data td/dpo_train.jsonl --val identical.jsonl --steps 1 --out refused
expect_error "sft, every conversation longer than --seq" "no conversation to train on (40 records, 40 longer than --seq 16" \
  "$bin" sft --ckpt sft/checkpoint --data td/sft_train.jsonl --seq 16 --steps 1 --out refused
expect_error "sft, malformed line" "bad.jsonl:2: messages\[0\]: unknown role 'wizard'" \
  "$bin" sft --ckpt sft/checkpoint --data bad.jsonl --steps 1 --out refused
expect_error "sft without a checkpoint" "flag --ckpt is required" "$bin" sft --data td/sft_train.jsonl
[ -e refused ] && fail "a refused post-training run left its folder"

# Refusals: one line each, naming the file.
"$bin" tokenizer train --vocab 600 --out big.json text.txt >/dev/null 2>&1 || fail "tokenizer train (600)"
# (A preset follows its tokenizer; a config.json that sets vocab_size does not.)
cp run/checkpoint/config.json fixed_vocab.json
expect_error "tokenizer larger than the model" "big.json: .* tokens do not fit the model's vocab_size 320" \
  "$bin" pretrain "${run[@]}" --model fixed_vocab.json --tokenizer big.json --steps 2 --out big
[ -e big ] && fail "a refused run left its folder"
"$bin" tokenizer train --vocab 290 --out other.json text.txt >/dev/null || fail "tokenizer train (290)"
expect_error "another tokenizer on resume" "is not the tokenizer run/checkpoint was trained with" \
  "$bin" pretrain --resume run/checkpoint --steps 9 --tokenizer other.json --threads 1
sed 's/"type": *"BPE"/"type": "Unigram"/' tok.json >unigram.json
expect_error "tokenizer of another kind" "unigram.json: model type 'Unigram' is not supported" \
  "$bin" tokenizer encode --tokenizer unigram.json "text"
expect_error "tokenizer train without files" "tokenizer train needs --out" "$bin" tokenizer train --out x.json
expect_error "tokenizer without a subcommand" "tokenizer needs a subcommand" "$bin" tokenizer
expect_error "tokenizer train, bad pattern" "pattern 'bert' is not one of gpt2, llama3, ling" \
  "$bin" tokenizer train --pattern bert --out x.json text.txt
[ -e x.json ] && fail "a refused tokenizer train wrote its output"

finish post_training
