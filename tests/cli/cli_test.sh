#!/usr/bin/env bash
# End-to-end checks of the lingtrain binary: resume is bit-identical to an uninterrupted run, a
# checkpoint round-trips through eval, and bad input gives one clear error line and a non-zero exit.
# Usage: cli_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

# A small text corpus, made into shards by the binary itself.
make_text_shards
train=data/train_000000.bin
val=data/val_000000.bin
common=(--model tiny --data "$train" --val "$val" --batch 2 --seq 32 --threads 2 --sample-prompt "" --eval-every 0
  --routing-warmup 3 --warmup-steps 2)

# Resume: 6 steps straight vs 3 steps, then resume to 6 (with a checkpoint at 3 in the first run too).
"$bin" pretrain "${common[@]}" --out full --steps 6 --ckpt-every 3 >/dev/null 2>&1 || fail "pretrain full"
"$bin" pretrain "${common[@]}" --out part --steps 3 >/dev/null 2>&1 || fail "pretrain part"
"$bin" pretrain --out part --steps 6 --resume part/checkpoint >/dev/null 2>&1 || fail "pretrain resume"
cmp -s full/checkpoint/model.safetensors part/checkpoint/model.safetensors || fail "resumed weights differ"
cmp -s full/checkpoint/optimizer.safetensors part/checkpoint/optimizer.safetensors || fail "resumed optimizer differs"
# Metrics agree in everything but wall-clock timing.
strip_timing() { tail -1 "$1" | sed 's/"step_seconds":[^,}]*//; s/"tokens_per_s":[^,}]*//; s/"elapsed_s":[^,}]*//'; }
[ "$(strip_timing full/metrics.jsonl)" = "$(strip_timing part/metrics.jsonl)" ] || fail "resumed metrics differ"

# A recipe with a RoPE theta switch and a longer context resumes bit for bit from checkpoints taken
# mid-stage: stop in the first stage, resume and stop in the second, resume to the end.
cat >recipe.json <<EOF
{"model": "tiny", "seed": 3, "routing_warmup": 6, "stages": [
  {"name": "short", "steps": 3, "batch": 2, "seq": 32, "rope_theta": 10000, "lr_schedule": "wsd", "lr": 3e-3,
   "warmup_steps": 1, "data": "$train", "val": "$val"},
  {"name": "long", "steps": 4, "batch": 1, "seq": 64, "rope_theta": 600000, "lr_schedule": "inverse_sqrt",
   "lr": 1e-3, "min_lr": 1e-5, "warmup_steps": 0, "data": "$train", "val": "$val"}]}
EOF
rflags=(--threads 2 --sample-prompt "" --eval-every 0)
"$bin" pretrain --recipe recipe.json "${rflags[@]}" --out rfull >/dev/null 2>&1 || fail "recipe full"
"$bin" pretrain --recipe recipe.json "${rflags[@]}" --out rpart --stop-at 2 >/dev/null 2>&1 || fail "recipe part"
"$bin" pretrain --resume rpart/checkpoint "${rflags[@]}" --out rpart --stop-at 5 >/dev/null 2>&1 || fail "recipe resume 1"
grep -q '"stage": 1' rpart/checkpoint/trainer_state.json || fail "the second stop is not in the second stage"
grep -q '"rope_theta": 600000' rpart/checkpoint/config.json || fail "the checkpoint's config lacks the stage's rope_theta"
"$bin" pretrain --resume rpart/checkpoint "${rflags[@]}" --out rpart >/dev/null 2>&1 || fail "recipe resume 2"
cmp -s rfull/checkpoint/model.safetensors rpart/checkpoint/model.safetensors || fail "recipe: resumed weights differ"
cmp -s rfull/checkpoint/optimizer.safetensors rpart/checkpoint/optimizer.safetensors || fail "recipe: resumed optimizer differs"
[ "$(strip_timing rfull/metrics.jsonl)" = "$(strip_timing rpart/metrics.jsonl)" ] || fail "recipe: resumed metrics differ"
[ "$(grep -vc '"heldout":"end"' rpart/metrics.jsonl)" = 7 ] ||
  fail "recipe: $(grep -vc '"heldout":"end"' rpart/metrics.jsonl) metrics lines of steps, expected 7"
echo '{"stages": [{"steps": 2, "sequence": 64}]}' >badrecipe.json
expect_error "unknown recipe key" "sequence" "$bin" pretrain --recipe badrecipe.json
expect_error "stage flag with a recipe" "recipe" "$bin" pretrain --recipe recipe.json --steps 3

# Eval of the checkpoint: a JSON line with loss and tokens; every token after the first is predicted once.
"$bin" eval --ckpt full/checkpoint --data "$val" >eval.txt 2>/dev/null || fail "eval"
tokens=$(tail -1 eval.txt | sed -n 's/.*"tokens":\([0-9]*\).*/\1/p')
size=$(stat -c %s "$val")
expected=$(((size - 1024) / 2 - 1))
[ "$tokens" = "$expected" ] || fail "eval predicted $tokens tokens, expected $expected"
grep -q '"loss":' eval.txt || fail "eval prints no loss"
"$bin" sample --ckpt full/checkpoint --prompt "int f" --tokens 16 >/dev/null 2>&1 || fail "sample"

# Bad input.
expect_error "unknown flag" "unknown flag --stepz" "$bin" pretrain --stepz 3
expect_error "unknown command" "unknown command" "$bin" pretrian
echo '{"model_type": "bailing_moe", "hidden_size": 64,' >bad.json
expect_error "malformed config" "bad.json" "$bin" pretrain --model bad.json --data "$train"
echo '{"model_type": "bailing_moe", "vocab_size": 320, "hidden_size": "wide"}' >typed.json
expect_error "mistyped config" "hidden_size" "$bin" pretrain --model typed.json --data "$train"
cp -r full/checkpoint trunc
truncate -s -100 trunc/model.safetensors
expect_error "truncated safetensors" "model.safetensors" "$bin" eval --ckpt trunc --data "$val"
cp -r full/checkpoint wrongdtype
perl -0777 -pi -e 's/"dtype":"F32"/"dtype":"I32"/' wrongdtype/model.safetensors
expect_error "wrong-dtype safetensors" "floating" "$bin" eval --ckpt wrongdtype --data "$val"
cp -r full/checkpoint mismatch
sed -i 's/"hidden_size": 128/"hidden_size": 96/' mismatch/config.json
expect_error "shape mismatch" "shape" "$bin" eval --ckpt mismatch --data "$val"
head -c 1024 "$val" >badheader.bin
printf 'garbage' >>badheader.bin
expect_error "bad shard header" "badheader.bin" "$bin" eval --ckpt full/checkpoint --data badheader.bin
# A valid uint16 shard (magic 20240520, version 1, 3 tokens) holding token 1000 >= vocab 320.
{ printf '\x88\xd8\x34\x01\x01\x00\x00\x00\x03\x00\x00\x00'; head -c 1012 /dev/zero; printf '\x01\x00\xe8\x03\x02\x00'; } >bigtoken.bin
expect_error "token >= vocab" "bigtoken.bin: token 1000 at position 1 is >= vocab_size 320" \
  "$bin" eval --ckpt full/checkpoint --data bigtoken.bin --seq 2
expect_error "missing checkpoint" "nowhere" "$bin" eval --ckpt nowhere --data "$val"

finish cli
