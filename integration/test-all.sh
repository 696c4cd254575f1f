#!/usr/bin/env bash
# Runs the whole test suite of cruise-rs. This is the README's test command
# and what CI runs (.ci/run calls it after fmt, clippy and the build).
#
#   integration/test-all.sh            everything
#   integration/test-all.sh --rust     only `cargo test --workspace`
#
# It installs what the tests need itself (a Python venv with the third-party
# clients, Hadoop's Java client jars; cached in ${CRUISE_CACHE_DIR:-~/.cache/cruise-rs}).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }
T0=$(date +%s)

step "cargo test --workspace (unit, property, in-process cluster, multi-process end-to-end, simulators)"
# Tests run with a bounded number of threads: several start real clusters.
cargo test --workspace -- --test-threads "${CRUISE_TEST_THREADS:-2}"

if [ "${1:-}" = "--rust" ]; then
    exit 0
fi

# The binaries `cargo test --workspace` just built. Built again with `-p`,
# the packages' features would be unified without the rest of the
# workspace: a second build of most of it (4 minutes on 2 cores).
BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/debug"

step "conformance: third-party WebHDFS clients (HdfsCLI, fsspec, Hadoop's Java client) against cruise-sim webhdfs"
CRUISE_SIM_BIN="$BIN_DIR/cruise-sim" integration/conformance/webhdfs_conformance.sh

step "conformance: yarn-api-client against cruise-sim yarn, pymesos against cruise-sim mesos"
CRUISE_SIM_BIN="$BIN_DIR/cruise-sim" integration/conformance/yarn_mesos_conformance.sh

step "quality: every app against scikit-learn and its ground truth (real cruise jobs)"
CRUISE_BIN="$BIN_DIR/cruise" integration/quality/run.sh

step "all tests passed in $(( $(date +%s) - T0 )) s"
