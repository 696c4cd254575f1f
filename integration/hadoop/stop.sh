#!/usr/bin/env bash
# Stops the one-machine Hadoop started by start.sh: SIGTERM to the launcher,
# which stops YARN (and the containers its NodeManagers launched), HDFS and
# ZooKeeper; SIGKILL if it has not exited after 60 s.
set -euo pipefail
DIR="${1:-${TMPDIR:-/tmp}/cruise-hadoop}"
f="$DIR/hadoop.pid"
[ -f "$f" ] || { echo "hadoop: not running in $DIR (no hadoop.pid)" >&2; exit 0; }
pid=$(cat "$f")
if kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "hadoop: pid $pid still running after 60 s; killing it" >&2
        kill -9 "$pid" 2>/dev/null || true
    fi
    echo "hadoop: stopped"
fi
rm -f "$f" "$DIR/ready"
