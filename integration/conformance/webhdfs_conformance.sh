#!/usr/bin/env bash
# Conformance run: third-party WebHDFS clients against `cruise-sim webhdfs`.
#
#   integration/conformance/webhdfs_conformance.sh
#
# Installs/reuses the clients (webhdfs_setup.sh), builds cruise-sim if needed
# (or uses $CRUISE_SIM_BIN), starts the simulator on loopback port 0 with a
# standby namenode and a temporary root, and runs:
#   hdfscli  HdfsCLI 2.7.3            (webhdfs_hdfscli.py)
#   fsspec   fsspec's WebHDFS         (webhdfs_fsspec.py)
#   java     Hadoop's WebHdfsFileSystem 3.5 (WebHdfsConformance.java)
# Each covers status, list, create, append, ranged read, mkdirs, rename,
# delete and a 404, asserting on what is read back and on the bytes on disk.
# $WEBHDFS_CLIENTS picks a subset (default: "hdfscli fsspec java").
# With $CRUISE_HADOOP_DIR (a real Hadoop from integration/hadoop/start.sh)
# the same clients and checks also run against its WebHDFS.
# Exits non-zero, naming the failed clients, if any check fails.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CLIENTS="${WEBHDFS_CLIENTS:-hdfscli fsspec java}"
T0=$(date +%s)

log() { echo "webhdfs_conformance: $*" >&2; }
die() { echo "webhdfs_conformance: ERROR: $*" >&2; exit 1; }

# ---- clients ------------------------------------------------------------------
VENV="" JARS=""
while IFS='=' read -r key value; do
    case "$key" in
        venv) VENV="$value" ;;
        jars) JARS="$value" ;;
    esac
done < <("$HERE/webhdfs_setup.sh") || die "webhdfs_setup.sh failed"
[ -x "$VENV/bin/python" ] || die "webhdfs_setup.sh did not report a venv"
[ -d "$JARS" ] || die "webhdfs_setup.sh did not report the Hadoop jars"
PY="$VENV/bin/python"

# ---- simulator ----------------------------------------------------------------
if [ -n "${CRUISE_SIM_BIN:-}" ]; then
    SIM="$CRUISE_SIM_BIN"
else
    log "building cruise-sim"
    (cd "$REPO" && cargo build --quiet -p cruise-sim --bin cruise-sim) || die "cargo build -p cruise-sim failed"
    SIM="${CARGO_TARGET_DIR:-$REPO/target}/debug/cruise-sim"
fi
[ -x "$SIM" ] || die "simulator binary $SIM not found"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/webhdfs-conformance.XXXXXX")"
SIM_PID=""
cleanup() {
    if [ -n "$SIM_PID" ] && kill -0 "$SIM_PID" 2>/dev/null; then
        kill -TERM "$SIM_PID" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$SIM_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SIM_PID" 2>/dev/null || true
        wait "$SIM_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

RUST_LOG="${RUST_LOG:-info}" "$SIM" webhdfs --root "$WORK/root" --ready-file "$WORK/ready.json" \
    --standby 2>"$WORK/sim.log" &
SIM_PID=$!
for _ in $(seq 300); do
    [ -s "$WORK/ready.json" ] && break
    kill -0 "$SIM_PID" 2>/dev/null || { cat "$WORK/sim.log" >&2; die "cruise-sim webhdfs exited before it was ready"; }
    sleep 0.1
done
[ -s "$WORK/ready.json" ] || die "cruise-sim webhdfs wrote no ready file within 30 s"
read -r NN DN SB < <("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["namenode"], r["datanode"], r["standby"])' "$WORK/ready.json")
log "simulator: namenode $NN, datanode $DN, standby $SB, root $WORK/root"

# ---- runs ---------------------------------------------------------------------
# A client against a real HDFS: no simulator root ("-"), no standby.
run_real() {
    local name="$1"
    case "$name" in
        hdfscli) "$PY" "$HERE/webhdfs_hdfscli.py" "$NN" "-" "-" ;;
        fsspec) "$PY" "$HERE/webhdfs_fsspec.py" "$NN" "-" ;;
        java)
            local cp
            cp="$(find "$JARS" -maxdepth 1 -name '*.jar' | sort | tr '\n' ':')"
            mkdir -p "$WORK/classes"
            javac -nowarn -d "$WORK/classes" -cp "$cp" "$HERE/WebHdfsConformance.java" || return 1
            java -cp "${cp}$WORK/classes" WebHdfsConformance "${NN#http://}" "-" "-" 2> >(grep -v '^SLF4J' >&2)
            ;;
        *) echo "unknown client $name (expected hdfscli, fsspec or java)"; return 1 ;;
    esac
}

run_client() {
    local name="$1"
    case "$name" in
        hdfscli) "$PY" "$HERE/webhdfs_hdfscli.py" "$NN" "$SB" "$WORK/root" ;;
        fsspec) "$PY" "$HERE/webhdfs_fsspec.py" "$NN" "$WORK/root" ;;
        java)
            local cp
            cp="$(find "$JARS" -maxdepth 1 -name '*.jar' | sort | tr '\n' ':')"
            mkdir -p "$WORK/classes"
            javac -nowarn -d "$WORK/classes" -cp "$cp" "$HERE/WebHdfsConformance.java" || return 1
            java -cp "${cp}$WORK/classes" WebHdfsConformance "${NN#http://}" "${SB#http://}" "$WORK/root" 2> >(grep -v '^SLF4J' >&2)
            ;;
        *) echo "unknown client $name (expected hdfscli, fsspec or java)"; return 1 ;;
    esac
}

FAILED=()
# Against a real HDFS too (CRUISE_HADOOP_DIR: integration/hadoop/start.sh
# DIR): the same clients and checks, bytes read back through WebHDFS, files
# under /tmp/conformance-<pid> (a non-superuser may not write under /).
if [ -n "${CRUISE_HADOOP_DIR:-}" ]; then
    REAL_NN="http://$(sed -n 's/^NN_HTTP=//p' "$CRUISE_HADOOP_DIR/cluster.env")"
    [ "$REAL_NN" != "http://" ] || die "$CRUISE_HADOOP_DIR/cluster.env has no NN_HTTP"
    log "real HDFS: namenode $REAL_NN"
    for client in $CLIENTS; do
        t=$(date +%s)
        echo "== $client against real HDFS"
        if CONFORMANCE_BASE="/tmp/conformance-$$" NN="$REAL_NN" SB="-" run_real "$client"; then
            echo "== $client against real HDFS: passed ($(( $(date +%s) - t )) s)"
        else
            echo "== $client against real HDFS: FAILED"
            FAILED+=("$client-real")
        fi
    done
fi
for client in $CLIENTS; do
    t=$(date +%s)
    echo "== $client"
    if run_client "$client"; then
        echo "== $client: passed ($(( $(date +%s) - t )) s)"
    else
        echo "== $client: FAILED"
        FAILED+=("$client")
    fi
done

# The simulator must still be alive and must stop cleanly on SIGTERM.
if ! kill -0 "$SIM_PID" 2>/dev/null; then
    FAILED+=("simulator-died")
else
    kill -TERM "$SIM_PID"
    if wait "$SIM_PID"; then
        echo "== simulator: clean shutdown on SIGTERM"
    else
        FAILED+=("simulator-shutdown")
    fi
    SIM_PID=""
fi

if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "---- simulator log (last 40 lines) ----"
    tail -n 40 "$WORK/sim.log"
    die "failed: ${FAILED[*]} (total $(( $(date +%s) - T0 )) s)"
fi
echo "webhdfs conformance: all clients passed ($CLIENTS) in $(( $(date +%s) - T0 )) s"
