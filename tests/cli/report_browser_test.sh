#!/usr/bin/env bash
# The training report as a person sees it: a short run with a loss spike, its report rendered by headless
# Chromium, which must log nothing to the console (no script error, no failed load: the page fetches
# nothing), with every section present and drawn. A page that does log an error must be caught the same
# way, so the check itself is known to work. Chromium comes from Debian (`scripts/setup.sh --test`, run
# by `make test`); without it the test is skipped (exit 77) with a message.
# Usage: report_browser_test.sh path/to/lingtrain
source "$(dirname "$0")/common.sh"

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "SKIP: no Chromium (install it with scripts/setup.sh --test, or apt-get install chromium)"
  exit 77
fi
# As root Chromium needs --no-sandbox; /dev/shm in containers is too small for it.
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --disable-extensions
  --enable-logging=stderr --v=0)
# render PAGE: the DOM after load into dom.html, the browser's log (console messages included) into console.log.
render() { timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$PWD/$1" >dom.html 2>console.log; }

# The detector works: a console error and an uncaught exception both show in the log.
printf '<!DOCTYPE html><html><body><p>x</p><script>console.error("planted error"); missing_function();</script></body></html>' >bad.html
render bad.html || fail "chromium did not render a page ($(tail -2 console.log))"
grep -q 'CONSOLE.*planted error' console.log || fail "a console error is not visible in Chromium's log: $(grep -c . console.log) lines"
grep -q 'CONSOLE.*missing_function' console.log || fail "an uncaught exception is not visible in Chromium's log"

"$bin" pretrain --model tiny --steps 60 --batch 4 --seq 64 --eval-every 20 --spike-warmup 10 --inject spike@40:30 \
  --sample-prompt "" --threads 1 --out run >train.txt 2>train.err || fail "training run: $(tail -1 train.err)"
"$bin" report --run run --domain-tokens 1024 --threads 1 >report.txt 2>report.err || fail "report: $(tail -1 report.err)"
grep -q "training report written to run/report.html" report.txt || fail "report: no path printed: $(cat report.txt)"

render run/report.html || fail "chromium failed on the report ($(tail -2 console.log))"
grep 'CONSOLE' console.log && fail "the report logs to the browser console"
grep -qi '<h1>Training report' dom.html || fail "the rendered page has no title heading"
# Every section, each with what draws it: charts (svg) or tables.
section() { awk -v id="$1" 'index($0, "<section id=\"" id "\"") { print; exit }' RS='</section>' dom.html; }
for id in summary loss learning-rate gradient-norm auxiliary-losses throughput expert-load routing-entropy specialisation; do
  body=$(section "$id")
  [ -n "$body" ] || { fail "section '$id' is missing"; continue; }
  case $id in
    summary) grep -q '<table' <<<"$body" || fail "section '$id' has no table" ;;
    *) grep -q '<svg' <<<"$body" || fail "section '$id' draws nothing" ;;
  esac
  grep -q 'no values logged' <<<"$body" && fail "section '$id' has a chart with no values"
done
grep -q '<table' <<<"$(section spikes)" || fail "the spike at step 40 is not in the spikes section"
grep -q '<pre' <<<"$(section configuration)" || fail "section 'configuration' shows no config"
grep -q 'was not profiled' <<<"$(section profile)" || fail "an unprofiled run's profile section does not say so"
# Three MoE layers of the tiny model: a load heatmap and a specialisation matrix each.
[ "$(grep -o 'Expert load over training, layer [0-9]' dom.html | sort -u | wc -l)" = 3 ] || fail "not 3 expert-load heatmaps"
[ "$(grep -o 'Domain × expert, layer [0-9]' dom.html | sort -u | wc -l)" = 3 ] || fail "not 3 domain x expert matrices"
# Self-contained: nothing is fetched (no script, no external reference).
grep -Eq '<script|(src|href)="(https?:)?//' run/report.html && fail "the report references something outside itself"

# How a person sees it: a screenshot of the whole page, which cannot be blank (a white page is a few KB).
timeout 120 "$browser" "${flags[@]}" --hide-scrollbars --window-size=1280,6000 --screenshot="$PWD/shot.png" \
  "file://$PWD/run/report.html" >/dev/null 2>&1 || fail "no screenshot"
[ "$(stat -c %s shot.png 2>/dev/null || echo 0)" -gt 100000 ] || fail "the screenshot is nearly empty ($(stat -c %s shot.png 2>/dev/null) bytes)"
# Two ranks, one three times as slow, profiled every 10 steps: the profile section draws the op families
# and a timeline lane per rank; the ranks section each rank's time per step and the slow rank.
mpiexec -n 2 "$bin" pretrain --model tiny --steps 30 --batch 2 --seq 32 --eval-every 0 --sample-prompt "" --threads 1 \
  --profile-every 10 --straggle 1:3 --out ranks >/dev/null 2>ranks.err || fail "two-rank run: $(tail -1 ranks.err)"
"$bin" report --run ranks --domain-tokens 256 --threads 1 >/dev/null 2>report.err || fail "report: $(tail -1 report.err)"
render ranks/report.html || fail "chromium failed on the two-rank report ($(tail -2 console.log))"
grep 'CONSOLE' console.log && fail "the two-rank report logs to the browser console"
profile=$(section profile)
[ "$(grep -o '<svg' <<<"$profile" | wc -l)" = 2 ] || fail "profile section: not an op chart and a timeline"
grep -q 'Time per op family' <<<"$profile" && grep -q 'rank 1:' <<<"$profile" ||
  fail "profile section: no op bars or no lane for rank 1"
grep -q '<table' <<<"$profile" || fail "profile section: no per-rank table"
ranks=$(section ranks)
grep -q '<svg' <<<"$ranks" || fail "ranks section draws nothing"
grep -q '<td>1</td>' <<<"$ranks" || fail "ranks section: rank 1 is not named as slow"
finish report_browser_test
