#!/usr/bin/env bash
# The README's picture of the training report: out/tiny/report.html (written by `make train`) rendered by
# headless Chromium from Debian, as a person sees it, into docs/report.png.
# Usage: scripts/report_screenshot.sh [REPORT (out/tiny/report.html)] [PNG (docs/report.png)] [HEIGHT (6200)]
# HEIGHT is the page's height in pixels at 1280 wide (headless Chromium captures the window, not the
# page); the tiny model's report fits in the default.
set -euo pipefail
report=$(realpath "${1:-out/tiny/report.html}")
png=$(realpath -m "${2:-docs/report.png}")
height=${3:-6200}
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "report_screenshot: no Chromium (scripts/setup.sh --test installs it)" >&2; exit 1; }
[ -f "$report" ] || { echo "report_screenshot: $report: no such file (make train writes it)" >&2; exit 1; }
timeout 120 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
  --window-size="1280,$height" --screenshot="$png" "file://$report" >/dev/null 2>&1
echo "report_screenshot: $png"
