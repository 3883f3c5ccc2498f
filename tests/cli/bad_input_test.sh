#!/usr/bin/env bash
# The bad-input table (docs/reliability.md): every subcommand given missing, unreadable, malformed or
# out-of-range input exits non-zero with exactly one stderr line that names the file or flag at fault,
# and leaves no half-written file behind. The files are crafted with printf and dd only.
# Usage: bad_input_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

make_text_shards
train=data/train_000000.bin
val=data/val_000000.bin
run=(--model tiny --data "$train" --val "$val" --seq 32 --batch 2 --steps 2 --threads 1 --sample-prompt "" --eval-every 0)
"$bin" pretrain "${run[@]}" --out ok >/dev/null 2>&1 || fail "the good run"
ckpt=ok/checkpoint

# A copy of the good checkpoint with one file replaced: copy_ckpt NAME FILE CONTENT_FILE.
copy_ckpt() {
  rm -rf "$1" && cp -r "$ckpt" "$1" && cp "$3" "$1/$2"
}
# safetensors FILE HEADER [DATA_BYTES]: a safetensors file with this JSON header and that many zero bytes.
safetensors() {
  local n=${#2}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) $((n >> 24 & 255)))" >"$1"
  printf '%s' "$2" >>"$1"
  head -c "${3:-0}" /dev/zero >>"$1"
}
# shard_with FILE OFFSET BYTES: a copy of the good shard with BYTES (printf escapes) written at OFFSET.
shard_with() {
  cp "$train" "$1"
  printf "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# Files and folders.
expect_error "missing data" "missing.bin: cannot open" "$bin" pretrain "${run[@]}" --data missing.bin --out x1
expect_error "data is a folder" "data: " "$bin" pretrain "${run[@]}" --data data --out x2
expect_error "missing resume" "nowhere: no checkpoint here" "$bin" pretrain --resume nowhere --threads 1
echo file >notadir
expect_error "output under a file" "notadir" "$bin" pretrain "${run[@]}" --out notadir/run
expect_error "eval without ckpt" "eval needs --ckpt" "$bin" eval --data "$val"
expect_error "eval missing ckpt" "gone: no checkpoint here" "$bin" eval --ckpt gone --data "$val"
expect_error "eval missing data" "nodata.bin: cannot open" "$bin" eval --ckpt "$ckpt" --data nodata.bin
expect_error "sample missing ckpt" "gone: no checkpoint here" "$bin" sample --ckpt gone --prompt hi
expect_error "compare without vs" "compare needs --ckpt A and --vs B" "$bin" compare --ckpt "$ckpt"
expect_error "compare missing ckpt" "gone: no checkpoint here" "$bin" compare --ckpt "$ckpt" --vs gone
expect_error "shards missing text" "nothing.txt" "$bin" shards --out s/x nothing.txt
expect_error "shards output under a file" "notadir" "$bin" shards --out notadir/x a.txt

# Safetensors.
head -c 10 "$ckpt/model.safetensors" >short.safetensors
copy_ckpt t1 model.safetensors short.safetensors
expect_error "truncated safetensors" "t1/model.safetensors" "$bin" eval --ckpt t1 --data "$val"
printf '\xff\xff\xff\xff\xff\xff\x00\x00{}' >huge.safetensors
copy_ckpt t2 model.safetensors huge.safetensors
expect_error "oversized safetensors header" "t2/model.safetensors" "$bin" eval --ckpt t2 --data "$val"
safetensors notjson.safetensors 'not json'
copy_ckpt t3 model.safetensors notjson.safetensors
expect_error "safetensors header not JSON" "t3/model.safetensors" "$bin" eval --ckpt t3 --data "$val"
safetensors dtype.safetensors '{"model.word_embeddings.weight":{"dtype":"I64","shape":[320,64],"data_offsets":[0,163840]}}' 163840
copy_ckpt t4 model.safetensors dtype.safetensors
expect_error "wrong dtype" "t4/model.safetensors" "$bin" eval --ckpt t4 --data "$val"
safetensors shape.safetensors '{"model.word_embeddings.weight":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]}}' 60
copy_ckpt t5 model.safetensors shape.safetensors
expect_error "wrong shape" "t5/model.safetensors" "$bin" eval --ckpt t5 --data "$val"
safetensors offsets.safetensors '{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,1600]}}' 16
copy_ckpt t6 model.safetensors offsets.safetensors
expect_error "data offsets past the end" "t6/model.safetensors" "$bin" eval --ckpt t6 --data "$val"
"$bin" params --model moe-s >/dev/null || fail "params moe-s"
rm -rf t7 && cp -r "$ckpt" t7 && sed 's/"hidden_size": *[0-9]*/"hidden_size": 96/' "$ckpt/config.json" >t7/config.json
expect_error "checkpoint of another config" "t7" "$bin" eval --ckpt t7 --data "$val"
rm -rf t8 && cp -r "$ckpt" t8 && sed 's/"max_position_embeddings": *[0-9]*/"max_position_embeddings": 0/' "$ckpt/config.json" >t8/config.json
expect_error "max_position_embeddings 0" "max_position_embeddings must be > 0" "$bin" eval --ckpt t8 --data "$val"
rm -rf t9 && cp -r "$ckpt" t9 && printf '{"vocab_size": 320,' >t9/config.json
expect_error "malformed config.json" "t9/config.json" "$bin" eval --ckpt t9 --data "$val"
rm -rf t10 && cp -r "$ckpt" t10 && printf '{"state": 1}' >t10/trainer_state.json
expect_error "malformed trainer_state.json" "t10/trainer_state.json" "$bin" pretrain --resume t10 --threads 1
rm -rf t11 && cp -r "$ckpt" t11 && sed 's/"epoch": *[0-9]*/"epoch": -3/' "$ckpt/trainer_state.json" >t11/trainer_state.json
expect_error "negative data cursor" "t11/trainer_state.json: data_cursor epoch, position and given must be >= 0" \
  "$bin" pretrain --resume t11 --threads 1

# Token shards.
shard_with badmagic.bin 0 '\x01\x02\x03\x04'
expect_error "shard with a bad magic" "badmagic.bin: not a token shard" "$bin" pretrain "${run[@]}" --data badmagic.bin --out x3
shard_with count.bin 8 '\xff\xff\xff\x00'
expect_error "shard count beyond the file" "count.bin: header says" "$bin" pretrain "${run[@]}" --data count.bin --out x4
shard_with negative.bin 8 '\xff\xff\xff\xff'
expect_error "shard count negative" "negative.bin: header token count -1 is negative" "$bin" pretrain "${run[@]}" --data negative.bin --out x5
shard_with vocab.bin 1024 '\xff\xff'
expect_error "token id beyond the vocabulary" "vocab.bin: token 65535 at position 0 is >= vocab_size 320" "$bin" eval --ckpt "$ckpt" --data vocab.bin
head -c 100 "$train" >tiny.bin
expect_error "shard shorter than its header" "tiny.bin: not a token shard" "$bin" pretrain "${run[@]}" --data tiny.bin --out x6

# Flags.
expect_error "zero batch" "batch" "$bin" pretrain "${run[@]}" --batch 0 --out x7
expect_error "negative seq" "seq" "$bin" pretrain "${run[@]}" --seq -1 --out x8
expect_error "zero steps" "steps" "$bin" pretrain "${run[@]}" --steps 0 --out x9
expect_error "NaN learning rate" "flag --lr needs a number, got 'nan'" "$bin" pretrain "${run[@]}" --lr nan --out x10
expect_error "negative clip" "clip and weight_decay must be >= 0" "$bin" pretrain "${run[@]}" --clip -1 --out x11
expect_error "negative routing warmup" "flag --routing-warmup must be >= 0" "$bin" pretrain "${run[@]}" --routing-warmup -5 --out x12
expect_error "overflowing steps" "flag --steps is out of range" "$bin" pretrain "${run[@]}" --steps 99999999999999999999 --out x13
expect_error "unknown flag" "unknown flag --foo" "$bin" pretrain "${run[@]}" --foo 1
expect_error "unknown schedule" "unknown lr schedule 'bogus'" "$bin" pretrain "${run[@]}" --lr-schedule bogus --out x14
expect_error "unknown dist" "unknown --dist 'bogus'" "$bin" pretrain "${run[@]}" --dist bogus --out x15
expect_error "negative threads" "flag --threads must be >= 0" "$bin" pretrain "${run[@]}" --threads -1
expect_error "unknown device" "device 'tpu' is not cpu, cuda or cuda:N" "$bin" pretrain "${run[@]}" --device tpu --out x20
expect_error "unknown dtype" "flag --dtype must be f32, bf16 or tf32, got 'f16'" "$bin" pretrain "${run[@]}" --dtype f16 --out x22
expect_error "unknown save dtype" "flag --save-dtype must be f32 or bf16, got 'f16'" "$bin" pretrain "${run[@]}" --save-dtype f16 --out x24
# --device cuda where no GPU can take it: the reason, in one line (a machine with a GPU trains instead).
case "$("$bin" --version)" in
  *"cuda: not compiled in"*) expect_error "cuda without the backend" "built without CUDA" "$bin" pretrain "${run[@]}" --device cuda --out x21 ;;
  *"0 device(s) found"*) expect_error "cuda without a GPU" "no CUDA device is usable" "$bin" pretrain "${run[@]}" --device cuda --out x21 ;;
  *) expect_error "a GPU index past the last" "CUDA device(s), cuda:0 to" "$bin" pretrain "${run[@]}" --device cuda:64 --out x21 ;;
esac
expect_error "unknown model" "unknown model 'nosuchmodel' (presets: " "$bin" pretrain "${run[@]}" --model nosuchmodel --out x16
expect_error "bad injection" "flag --inject needs" "$bin" pretrain "${run[@]}" --inject boom@3 --out x17
expect_error "bad straggle" "flag --straggle needs RANK:FACTOR" "$bin" pretrain "${run[@]}" --straggle 1 --out x18
expect_error "bad hang injection" "flag --inject needs" "$bin" pretrain "${run[@]}" --inject hang@2:x --out x18
expect_error "bad slow-rank factor" "flag --slow-rank-factor must be > 1" "$bin" pretrain "${run[@]}" --slow-rank-factor 1 \
  --out x18
expect_error "negative collective timeout" "flag --collective-timeout must be >= 0" "$bin" pretrain "${run[@]}" \
  --collective-timeout -1 --out x18
expect_error "no checkpoints kept" "flag --keep-checkpoints" "$bin" pretrain "${run[@]}" --keep-checkpoints 0 --out x18
expect_error "bad keep-every" "flag --keep-every must be >= 0" "$bin" pretrain "${run[@]}" --keep-every -5 --out x18
expect_error "bad ckpt-async" "flag --ckpt-async" "$bin" pretrain "${run[@]}" --ckpt-async maybe --out x18
expect_error "negative profile-every" "flag --profile-every must be >= 0" "$bin" pretrain "${run[@]}" --profile-every -1 \
  --out x18
expect_error "eval seq beyond the model" "flag --seq 100000 exceeds max_position_embeddings" "$bin" eval --ckpt "$ckpt" --data "$val" --seq 100000
expect_error "sample zero tokens" "flag --tokens must be > 0" "$bin" sample --ckpt "$ckpt" --prompt hi --tokens 0
expect_error "params unknown model" "unknown model 'nosuch'" "$bin" params --model nosuch
expect_error "bench unknown config" "nosuch" "$bin" bench --config nosuch --steps 1
expect_error "gradcheck unknown op" "nosuch" "$bin" gradcheck --op nosuch
expect_error "gradcheck unknown op lists the ops" "no op named 'nosuch'; the ops: [a-z_0-9]*, [a-z_0-9]*" "$bin" gradcheck --op nosuch
expect_error "unknown command" "unknown command 'frobnicate'" "$bin" frobnicate
expect_error "unknown CPU target" "LINGTRAIN_CPU_TARGET=AVX9 is not a CPU target of this build (" \
  env LINGTRAIN_CPU_TARGET=AVX9 "$bin" pretrain "${run[@]}" --out x25
[ ! -e x25 ] || fail "a run with an unknown CPU target wrote its output folder"
printf '{"stages": [{"steps": 2, "bogus": 1}]}' >recipe.json
expect_error "recipe with an unknown key" "recipe.json: stage 0: unknown key 'bogus'" "$bin" pretrain --recipe recipe.json --out x19 --threads 1

# Every command's --help (and -h): its flags with their defaults and help, on stdout, exit 0; the
# top-level help stays.
"$bin" pretrain --help >help.txt 2>err.txt || fail "pretrain --help exited non-zero: $(cat err.txt)"
grep -q -- '^  --warmup-steps=30 .*linear learning-rate warmup steps$' help.txt || fail "pretrain --help: no --warmup-steps: $(head -20 help.txt)"
grep -q -- '^  --eval-every=200 .*under --dist aedit .* at the round.s end' help.txt || fail "pretrain --help: --eval-every does not say what aedit does"
grep -q -- '^  --ckpt-every=200 .*under --dist aedit .* at the round.s end' help.txt || fail "pretrain --help: --ckpt-every does not say what aedit does"
grep -q -- '--spike-threshold' help.txt && grep -q -- '--outer-lr' help.txt || fail "pretrain --help: no spike guard or EDiT flags"
grep -q -- '--beta' help.txt && fail "pretrain --help lists dpo's --beta"
"$bin" sft -h >help.txt 2>err.txt || fail "sft -h exited non-zero: $(cat err.txt)"
grep -q -- '^  --seq=512 ' help.txt && grep -q -- '^  --epochs=2' help.txt && grep -q -- '^  --eval-every=50 ' help.txt ||
  fail "sft -h: not sft's defaults: $(grep -- '--seq\|--epochs' help.txt)"
"$bin" dpo --help >help.txt || fail "dpo --help"
grep -q -- '^  --seq=1024 ' help.txt && grep -q -- '^  --beta=0.1 ' help.txt || fail "dpo --help: not dpo's defaults"
for cmd in version gradcheck params bench eval sample score eval-tools shards tokenizer chat-template tool-data inspect report; do
  "$bin" $cmd --help >help.txt 2>err.txt || fail "$cmd --help exited non-zero: $(cat err.txt)"
  grep -q -- "^  --" help.txt || fail "$cmd --help lists no flag: $(cat help.txt)"
done
"$bin" tokenizer train -h >help.txt && grep -q -- '--vocab' help.txt || fail "tokenizer train -h"
"$bin" --help >help.txt && grep -q '^usage: lingtrain <command>' help.txt || fail "lingtrain --help"
expect_error "an unknown flag next to --help is still named" "unknown flag --bogus" "$bin" pretrain --bogus 1

# Resumes that would silently change the run.
"$bin" pretrain "${run[@]}" --steps 4 --stop-at 2 --out part >/dev/null 2>&1 || fail "a stopped run"
expect_error "resume with another seq" "flag --seq cannot change in the middle of a stage" "$bin" pretrain --resume part/checkpoint --seq 64 --threads 1
expect_error "resume below the saved step" "--steps 1 is below the 2 steps" "$bin" pretrain --resume part/checkpoint --steps 1 --threads 1

# Nothing half-written: no staging folder anywhere, and no output folder for the runs refused up front.
leftovers=$(find . -name '*.tmp-*' | head -3)
[ -z "$leftovers" ] || fail "half-written files left: $leftovers"
for refused in x1 x3 x7 x10 x13 x16 x19 x20 x21 x22 x23 x24; do [ ! -e "$refused/checkpoint" ] || fail "$refused: a refused run wrote a checkpoint"; done

finish bad_input
