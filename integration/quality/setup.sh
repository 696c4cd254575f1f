#!/usr/bin/env bash
# Installs what the quality checks compare against, into a cache that later
# runs reuse: a Python venv with scikit-learn, numpy and scipy.
#
# Cache: ${CRUISE_CACHE_DIR:-$HOME/.cache/cruise-rs}/venv (shared with the
# WebHDFS conformance clients). Prints `venv=<path>` on success. Safe to
# re-run: it installs only what is missing.
set -euo pipefail

CACHE="${CRUISE_CACHE_DIR:-$HOME/.cache/cruise-rs}"
VENV="$CACHE/venv"
# Versions the checks were written against (any recent release works).
SKLEARN_SPEC="${CRUISE_SKLEARN_SPEC:-scikit-learn>=1.3}"

log() { echo "quality_setup: $*" >&2; }
die() { echo "quality_setup: ERROR: $*" >&2; exit 1; }

mkdir -p "$CACHE"
command -v python3 >/dev/null || die "python3 not found"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
if ! "$VENV/bin/python" -c "import sklearn, numpy, scipy" 2>/dev/null; then
    log "installing $SKLEARN_SPEC numpy scipy into $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "$SKLEARN_SPEC" numpy scipy \
        || die "pip install of scikit-learn, numpy and scipy failed"
fi
"$VENV/bin/python" -c "import sklearn, numpy, scipy" \
    || die "scikit-learn, numpy or scipy still missing from $VENV"
echo "venv=$VENV"
