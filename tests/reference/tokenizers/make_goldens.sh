#!/usr/bin/env bash
# Regenerates tests/golden/tokenizers and tests/golden/chat/goldens.json: the binary trains small byte-level BPE tokenizers (one per
# pre-tokenizer pattern), the script derives variants of them (merges as pairs, ignore_merges, a prefix
# space, added tokens with lstrip/rstrip), and Hugging Face's tokenizers.js (npm, pinned in
# package.json) encodes and decodes the test texts with each. tests/data/test_bpe_tokenizer.cpp checks
# that lingtrain gives the same ids. Then Hugging Face's Jinja engine renders the conversations of
# tests/golden/chat with Ling's chat template and tokenizers.js encodes them (tests/data/test_chat_template.cpp).
# Needs node and npm; the binary and CI need neither.
# Usage: tests/reference/tokenizers/make_goldens.sh [path/to/lingtrain]
set -euo pipefail
here=$(dirname "$(realpath "$0")")
repo=$(realpath "$here/../../..")
bin=$(realpath "${1:-$repo/build/lingtrain}")
out=$repo/tests/golden/tokenizers
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$here" && npm install --silent --no-audit --no-fund)
node "$here/make_goldens.mjs" text >"$work/train.txt"
for pattern in ling llama3 gpt2; do
  "$bin" tokenizer train --vocab 1024 --pattern "$pattern" --out "$work/$pattern.json" "$work/train.txt" >/dev/null
done
mkdir -p "$out"
node "$here/make_goldens.mjs" goldens "$work" "$out"
# Ling's chat template through Hugging Face's Jinja engine, on the conversations of tests/golden/chat.
node "$here/make_goldens.mjs" chat "$out/ling.json" "$repo/tests/golden/chat/conversations.jsonl" \
  "$repo/tests/golden/chat/goldens.json"
