#!/usr/bin/env bash
# CI stage: starts the real one-machine Hadoop (start.sh fetches the Hadoop
# jars with Maven, cached in ~/.m2, and waits until the RM and WebHDFS
# answer), runs the real-Hadoop end-to-end and differential tests and the
# third-party WebHDFS clients against it, and stops it, also on failure.
# The tests fail rather than skip when the cluster is missing
# (CRUISE_HADOOP_REQUIRED=1). Its cargo commands take the whole workspace:
# after .ci/run's build they build nothing (with `-p` they would build most
# of it again, its features unified differently). Prints the stage's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s)
HADOOP_DIR="$(mktemp -d "${TMPDIR:-/tmp}/cruise-ci-hadoop.XXXXXX")"
trap 'integration/hadoop/stop.sh "$HADOOP_DIR" >/dev/null 2>&1 || true' EXIT
if ! integration/hadoop/start.sh "$HADOOP_DIR"; then
    echo "---- $HADOOP_DIR/hadoop.log (last 60 lines) ----" >&2
    tail -n 60 "$HADOOP_DIR/hadoop.log" >&2 || true
    exit 1
fi
echo "hadoop: started in $(( $(date +%s) - T0 )) s"
if ! CRUISE_HADOOP_DIR="$HADOOP_DIR" CRUISE_HADOOP_REQUIRED=1 \
    cargo test --workspace --test hadoop_e2e --test hadoop_differential -- --ignored --test-threads 2; then
    echo "---- NodeManager logs: $HADOOP_DIR/logs, containers' logs: $HADOOP_DIR/nm-*/logs ----" >&2
    exit 1
fi
# The third-party WebHDFS clients (HdfsCLI, fsspec, Hadoop's own
# WebHdfsFileSystem) against real HDFS as well as cruise-sim.
cargo build --quiet --workspace --all-targets
CRUISE_SIM_BIN="${CARGO_TARGET_DIR:-$PWD/target}/debug/cruise-sim" CRUISE_HADOOP_DIR="$HADOOP_DIR" \
    integration/conformance/webhdfs_conformance.sh
integration/hadoop/stop.sh "$HADOOP_DIR"
echo "real Hadoop stage passed in $(( $(date +%s) - T0 )) s"
