#!/usr/bin/env bash
# Stops the sandbox started by start.sh (SIGTERM; the simulators stop the
# containers they launched).
set -euo pipefail
DIR="${1:-${TMPDIR:-/tmp}/cruise-sandbox}"
for name in mesos yarn webhdfs; do
    f="$DIR/$name.pid"
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        echo "sandbox: stopped $name"
    fi
    rm -f "$f"
done
