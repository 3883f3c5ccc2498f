#!/usr/bin/env bash
# `lingtrain bench --config NAME` ends with one JSON line holding the documented keys, and a bad flag
# gives one clear error line. One warm-up and one measured step of moe-s: a few seconds.
# Usage: bench_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

"$bin" bench --config moe-s --threads 1 --steps 1 --warmup 1 --profile 1 >"$work/out.txt" 2>"$work/err.txt" ||
  fail "bench exited non-zero: $(cat "$work/err.txt")"
grep -q '1 thread (' "$work/out.txt" && ! grep -q '1 threads' "$work/out.txt" || fail "not '1 thread': $(head -3 "$work/out.txt")"
last=$(tail -n 1 "$work/out.txt")
# A JSON object on one line, checked with the key names as quoted strings (no JSON tool needed).
case "$last" in
  "{"*"}") ;;
  *) fail "last line is not a JSON object: $last" ;;
esac
for key in config threads tokens_per_s gflops mfu peak_gflops peak_rss_mb step_ms flops_per_token \
  system_allocs_in_steady_state param_mb ops device_per_step; do
  grep -q "\"$key\":" <<<"$last" || fail "last line lacks \"$key\": $last"
done
grep -q '"config":"moe-s"' <<<"$last" || fail "config is not moe-s: $last"
grep -q '"threads":1' <<<"$last" || fail "threads is not 1: $last"
# nlohmann::json writes keys in sorted order: op, percent, phase.
grep -Eq '"op":"matmul","percent":[^,]*,"phase":"backward"' <<<"$last" || fail "no matmul backward in the profile: $last"

# --generate: tiny, 4 prompts of 4 new tokens, alone and together: the same tokens.
"$bin" bench --config tiny --generate 4 --tokens 4 --threads 1 >"$work/gen.txt" 2>"$work/err.txt" ||
  fail "bench --generate exited non-zero: $(cat "$work/err.txt")"
last=$(tail -n 1 "$work/gen.txt")
for key in one_at_a_time_tokens_per_s together_tokens_per_s speedup speedup_per_cpu_s; do
  grep -q "\"$key\":" <<<"$last" || fail "bench --generate: last line lacks \"$key\": $last"
done
grep -q '"same_tokens":true' <<<"$last" || fail "bench --generate: the rows decoded together differ: $last"
expect_error "generate without a config" "bench: --generate needs --config" "$bin" bench --generate 4

expect_error "bad flag" "unknown flag --stepz" "$bin" bench --config moe-s --stepz 1
expect_error "no bench shape" "has no bench shape" "$bin" bench --config tiny --steps 1
expect_error "bad part" "flag --part must be all, kernels or steps" "$bin" bench --part nonsense

finish bench
