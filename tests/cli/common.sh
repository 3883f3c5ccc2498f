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

# finish NAME: the closing line and the exit status.
finish() {
  if [ "$failures" -eq 0 ]; then echo "$1: all checks passed"; else echo "$1: $failures check(s) failed"; exit 1; fi
}
