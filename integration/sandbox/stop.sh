#!/usr/bin/env bash
# Stops the sandbox started by start.sh: SIGTERM to each simulator (they
# stop the containers they launched), SIGKILL to one still there after
# 10 s, then SIGKILL to any process left working in the simulators'
# container directories (a container of a simulator that could not stop
# it). Fails,
# listing them, if a process is still there after that.
set -euo pipefail
DIR="${1:-${TMPDIR:-/tmp}/cruise-sandbox}"
[ -d "$DIR" ] || { echo "sandbox: no sandbox in $DIR" >&2; exit 1; }
DIR="$(cd "$DIR" && pwd -P)"
alive() { kill -0 "$1" 2>/dev/null; }
for name in mesos yarn webhdfs; do
    f="$DIR/$name.pid"
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
        if alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null || true
            echo "sandbox: $name did not stop within 10 s: killed"
        else
            echo "sandbox: stopped $name"
        fi
    fi
    rm -f "$f"
done
# Processes working in the simulators' container directories (the
# containers they launched), this script and its caller aside.
left() {
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        [ "$pid" = "$$" ] || [ "$pid" = "$PPID" ] && continue
        cwd=$(readlink "$p/cwd" 2>/dev/null) || continue
        case "$cwd" in "$DIR"/yarn/*|"$DIR"/mesos/*) echo "$pid";; esac
    done
}
pids=$(left)
if [ -n "$pids" ]; then
    echo "sandbox: killing processes left in $DIR: $pids"
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    for _ in $(seq 1 50); do [ -z "$(left)" ] && break; sleep 0.1; done
fi
pids=$(left)
if [ -n "$pids" ]; then
    echo "sandbox: processes still running in $DIR: $pids" >&2
    exit 1
fi
echo "sandbox: stopped; no process left in $DIR"
