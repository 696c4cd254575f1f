#!/usr/bin/env bash
# Starts the pseudo-distributed sandbox: cruise-sim's WebHDFS, YARN and Mesos
# simulators on fixed loopback ports, and a HADOOP_CONF_DIR naming them.
#
#   integration/sandbox/start.sh [DIR]     (default DIR: $TMPDIR/cruise-sandbox)
#   source DIR/env.sh                      (exports HADOOP_CONF_DIR, MESOS_MASTER)
#   integration/sandbox/stop.sh [DIR]
#
# Ports (override with the variables): WebHDFS namenode $NN_PORT (9870),
# datanode $DN_PORT (9864), YARN RM $RM_PORT (8088), Mesos master
# $MESOS_PORT (5050). HDFS paths live under DIR/hdfs; the simulators' logs
# are DIR/*.log. The simulators really launch the containers they allocate.
# cruise-sim and cruise are target/release/ (CRUISE_SIM, CRUISE_BIN override
# them); whichever is missing is built first.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR="${1:-${TMPDIR:-/tmp}/cruise-sandbox}"
NN_PORT="${NN_PORT:-9870}"; DN_PORT="${DN_PORT:-9864}"
RM_PORT="${RM_PORT:-8088}"; MESOS_PORT="${MESOS_PORT:-5050}"
mkdir -p "$DIR/hadoop-conf" "$DIR/hdfs"

SIM="${CRUISE_SIM:-target/release/cruise-sim}"
CRUISE="${CRUISE_BIN:-target/release/cruise}"
# Build whatever is missing (cargo shows its progress: a first build takes
# a few minutes on 2 cores).
missing=()
[ -x "$SIM" ] || missing+=(-p cruise-sim)
[ -x "$CRUISE" ] || missing+=(-p cruise-appmaster)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "sandbox: building ${missing[*]} (release) for $SIM and $CRUISE" >&2
    cargo build --release "${missing[@]}"
fi

start() { # name, args...
    local name=$1; shift
    if [ -f "$DIR/$name.pid" ] && kill -0 "$(cat "$DIR/$name.pid")" 2>/dev/null; then
        echo "sandbox: $name already running (pid $(cat "$DIR/$name.pid"))" >&2
        return
    fi
    rm -f "$DIR/$name.ready"
    "$SIM" "$name" --ready-file "$DIR/$name.ready" "$@" >"$DIR/$name.log" 2>&1 &
    echo $! >"$DIR/$name.pid"
    for _ in $(seq 1 300); do
        [ -s "$DIR/$name.ready" ] && return
        kill -0 "$(cat "$DIR/$name.pid")" 2>/dev/null || { cat "$DIR/$name.log" >&2; echo "sandbox: $name failed to start" >&2; exit 1; }
        sleep 0.1
    done
    echo "sandbox: $name not ready after 30 s; see $DIR/$name.log" >&2
    exit 1
}

start webhdfs --root "$DIR/hdfs" --bind "127.0.0.1:$NN_PORT" --datanode-bind "127.0.0.1:$DN_PORT"
start yarn --bind "127.0.0.1:$RM_PORT" --webhdfs "http://127.0.0.1:$NN_PORT" --work-dir "$DIR/yarn"
start mesos --bind "127.0.0.1:$MESOS_PORT" --work-dir "$DIR/mesos"

prop() { printf '  <property><name>%s</name><value>%s</value></property>\n' "$1" "$2"; }
site() { printf '<?xml version="1.0"?>\n<configuration>\n%s\n</configuration>\n' "$1"; }
site "$(prop fs.defaultFS "hdfs://127.0.0.1:$NN_PORT")" >"$DIR/hadoop-conf/core-site.xml"
site "$(prop dfs.namenode.http-address "127.0.0.1:$NN_PORT")" >"$DIR/hadoop-conf/hdfs-site.xml"
site "$(prop yarn.resourcemanager.webapp.address "127.0.0.1:$RM_PORT")
$(prop yarn.scheduler.minimum-allocation-mb 1024)" >"$DIR/hadoop-conf/yarn-site.xml"
cat >"$DIR/env.sh" <<ENV
export HADOOP_CONF_DIR="$DIR/hadoop-conf"
export MESOS_MASTER="127.0.0.1:$MESOS_PORT"
ENV
cat <<MSG
sandbox running in $DIR
  WebHDFS  http://127.0.0.1:$NN_PORT   (files under $DIR/hdfs)
  YARN RM  http://127.0.0.1:$RM_PORT
  Mesos    http://127.0.0.1:$MESOS_PORT
next: source $DIR/env.sh
MSG
