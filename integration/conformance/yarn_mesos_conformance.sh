#!/usr/bin/env bash
# Run the third-party YARN and Mesos clients against cruise-sim:
#   yarn-api-client 1.0.3 -> cruise-sim yarn   (yarn_conformance.py)
#   pymesos 0.3.15        -> cruise-sim mesos  (mesos_conformance.py), entering
#                            through a --leader-redirect follower
#
# Sets up the venv (yarn_mesos_setup.sh, cached), builds cruise-sim (or uses
# $CRUISE_SIM_BIN), starts
# both simulators on 127.0.0.1 port 0, waits for their ready files, runs both
# scripts, stops the simulators (SIGTERM, which kills their processes) and
# exits non-zero if anything failed. Prints "N passed, M failed" at the end.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${CRUISE_CACHE_DIR:-$HOME/.cache/cruise-rs}/venv"
NODES=2
NODE_MB=4096

log() { echo "[yarn_mesos_conformance] $*" >&2; }

bash "$HERE/yarn_mesos_setup.sh"

if [ -n "${CRUISE_SIM_BIN:-}" ]; then
    BIN="$CRUISE_SIM_BIN"
else
    log "building cruise-sim"
    (cd "$ROOT" && cargo build -q -p cruise-sim)
    TARGET_DIR="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps \
        | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    BIN="$TARGET_DIR/debug/cruise-sim"
fi
[ -x "$BIN" ] || { log "no binary at $BIN"; exit 1; }

TMP="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    if [ "${KEEP_TMP:-0}" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

"$BIN" yarn --ready-file "$TMP/yarn.json" --work-dir "$TMP/yarn" \
    --nodes "$NODES" --node-memory-mb "$NODE_MB" --node-vcores 4 \
    --kill-grace-ms 500 >"$TMP/yarn.log" 2>&1 &
PIDS+=("$!")
"$BIN" mesos --ready-file "$TMP/mesos.json" --work-dir "$TMP/mesos" \
    --heartbeat-interval-secs 0.5 --allocation-interval-ms 100 \
    --update-retry-secs 1 --kill-grace-ms 500 >"$TMP/mesos.log" 2>&1 &
PIDS+=("$!")

wait_ready() {
    local file="$1" pid="$2" name="$3"
    for _ in $(seq 1 300); do
        [ -s "$file" ] && return 0
        if ! kill -0 "$pid" 2>/dev/null; then
            log "$name exited before it was ready:"; cat "$TMP/$name.log" >&2; return 1
        fi
        sleep 0.1
    done
    log "$name not ready after 30 s"; cat "$TMP/$name.log" >&2; return 1
}
wait_ready "$TMP/yarn.json" "${PIDS[0]}" yarn
wait_ready "$TMP/mesos.json" "${PIDS[1]}" mesos
LEADER="$("$VENV/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["master"])' "$TMP/mesos.json")"
"$BIN" mesos --ready-file "$TMP/follower.json" --leader-redirect "$LEADER" >"$TMP/follower.log" 2>&1 &
PIDS+=("$!")
wait_ready "$TMP/follower.json" "${PIDS[2]}" follower

passed=0
failed=0
run() {
    local name="$1"; shift
    if timeout 120 "$VENV/bin/python" "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        log "$name FAILED; simulator log tail:"
        tail -n 40 "$TMP/$name.log" >&2 || true
    fi
}
run yarn "$HERE/yarn_conformance.py" "$TMP/yarn.json" "$NODES" "$NODE_MB"
run mesos "$HERE/mesos_conformance.py" "$TMP/mesos.json" "$TMP/follower.json"

echo "yarn_mesos_conformance: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
