#!/usr/bin/env bash
# Quality of the cruise-rs apps against scikit-learn and known ground truths.
#
#   integration/quality/run.sh [mlr] [lasso] [nmf] [lda]     (default: all)
#   integration/quality/run.sh bench [--scale S (default 4)] [mlr] [mlr1000] [lasso] [nmf] [lda]
#
# The second form runs bench_throughput.py instead: single-core training
# throughput against scikit-learn (wants a quiet machine).
#
# Installs/reuses scikit-learn (setup.sh), builds the release `cruise` binary
# (or uses $CRUISE_BIN), and runs quality.py: real `cruise run` jobs on the
# local runtime, compared with scikit-learn and the generators' ground truth.
# Scratch files go to a temporary directory ($CRUISE_QUALITY_WORK keeps them).
# Exits non-zero, naming the failed checks, if any check fails.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
T0=$(date +%s)

log() { echo "quality: $*" >&2; }
die() { echo "quality: ERROR: $*" >&2; exit 1; }

VENV=""
while IFS='=' read -r key value; do
    [ "$key" = venv ] && VENV="$value"
done < <("$HERE/setup.sh") || die "setup.sh failed"
[ -x "$VENV/bin/python" ] || die "setup.sh did not report a venv"

if [ -n "${CRUISE_BIN:-}" ]; then
    BIN="$CRUISE_BIN"
else
    log "building the cruise binary (cargo build --release -p cruise-appmaster)"
    (cd "$REPO" && cargo build --release --quiet -p cruise-appmaster) || die "cargo build failed"
    BIN="$REPO/target/release/cruise"
fi
[ -x "$BIN" ] || die "no cruise binary at $BIN"

if [ -n "${CRUISE_QUALITY_WORK:-}" ]; then
    WORK="$CRUISE_QUALITY_WORK"
    mkdir -p "$WORK"
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/cruise-quality.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
fi

SCRIPT="$HERE/quality.py"
if [ "${1:-}" = bench ]; then
    shift
    SCRIPT="$HERE/bench_throughput.py"
fi
status=0
"$VENV/bin/python" "$SCRIPT" --cruise "$BIN" --work "$WORK" "$@" || status=$?
log "done in $(( $(date +%s) - T0 )) s (status $status)"
exit $status
