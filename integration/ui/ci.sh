#!/usr/bin/env bash
# CI stage: the tests of the job's web UI and metrics that need external
# tools — `promtool check metrics` and a real Prometheus scraping a job
# (Debian's `prometheus`), a headless browser on the live page and the
# report (Debian's `chromium`). Installs the tools when they are missing
# (about 20 s with apt-get on a Debian 12 machine), then runs the ignored
# tests of integration/tests/ui_e2e.rs with CRUISE_UI_TOOLS_REQUIRED=1, so
# a missing tool fails the stage instead of skipping. The browser test
# writes its screenshots to target/ui/. Prints the stage's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "ui: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "ui: installed in $(( $(date +%s) - T0 )) s"
fi
CRUISE_UI_TOOLS_REQUIRED=1 cargo test --workspace --test ui_e2e -- --ignored --test-threads 1
echo "UI tools stage passed in $(( $(date +%s) - T0 )) s"
