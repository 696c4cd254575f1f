#!/usr/bin/env bash
# Installs what the benchmarks (integration/src/bin/bench-*.rs) compare
# against, and builds them:
#   - iperf3 (Debian package), the loopback TCP reference of bench-dataplane
#     and bench-reconfig;
#   - scikit-learn (PyPI) in the shared venv
#     ${CRUISE_CACHE_DIR:-$HOME/.cache/cruise-rs}/venv, the reference of
#     bench-mlr (the venv is the one the WebHDFS conformance runs use);
#   - the release build of the workspace (the `cruise` binary and the benches).
#
# Safe to re-run: it only installs what is missing. Prints the venv's python.
set -euo pipefail
cd "$(dirname "$0")/../.."

CACHE="${CRUISE_CACHE_DIR:-$HOME/.cache/cruise-rs}"
VENV="$CACHE/venv"
SKLEARN_VERSION="${CRUISE_SKLEARN_VERSION:-1.9.1}"

log() { echo "bench setup: $*" >&2; }
die() { echo "bench setup: ERROR: $*" >&2; exit 1; }

# ---- iperf3 ----------------------------------------------------------------
if ! command -v iperf3 >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing iperf3"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iperf3 >/dev/null \
            || die "apt-get install iperf3 failed"
    else
        die "iperf3 not found; install it (Debian: apt-get install iperf3)"
    fi
fi

# ---- scikit-learn ----------------------------------------------------------
command -v python3 >/dev/null || die "python3 not found"
mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
if ! "$VENV/bin/python" -c "import sklearn, numpy, scipy" 2>/dev/null; then
    log "installing scikit-learn==$SKLEARN_VERSION into $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "scikit-learn==$SKLEARN_VERSION" \
        || die "pip install scikit-learn failed"
fi

# ---- release build ---------------------------------------------------------
log "building the release binaries (cruise and the benches)"
cargo build --release -p cruise-appmaster --bin cruise
cargo build --release -p cruise-integration --bins

echo "python=$VENV/bin/python"
