#!/usr/bin/env bash
# Look at an experiment report as a person would: render it in headless Chromium (Debian's
# `chromium` package) and write a PNG screenshot of the whole page.
#
#   scripts/report-screenshot.sh [REPORT.html] [OUT.png]
#
# Defaults: results/report.html (what `dtx experiment report` writes) and the same path with .png.
set -euo pipefail
report=${1:-results/report.html}
png=${2:-${report%.html}.png}
[[ -f $report ]] || { echo "error: no report at $report; run: dtx experiment report" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || true)
[[ -n $browser ]] || { echo "error: chromium is missing (apt-get install chromium)" >&2; exit 2; }
# The page's height: about 1500 px per experiment plus the summary; Chromium crops at the window.
experiments=$(grep -c '<h2 id=' "$report" || true)
height=$((600 + 1500 * (experiments > 0 ? experiments : 1)))
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1300,$height \
  --screenshot="$(realpath -m "$png")" "file://$(realpath "$report")" 2>/dev/null
echo "screenshot: $png (1300x$height)"
