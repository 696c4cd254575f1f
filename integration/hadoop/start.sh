#!/usr/bin/env bash
# Starts a real one-machine Hadoop for cruise's end-to-end tests: Hadoop's own
# MiniDFSCluster (NameNode + DataNode, WebHDFS on) and MiniYARNCluster (RM with
# its REST API and the YARN Services REST API, NodeManagers that launch real
# containers), in one JVM (see src/main/java/cruise/hadoop/Launcher.java).
#
#   integration/hadoop/start.sh [DIR]     (default DIR: $TMPDIR/cruise-hadoop)
#   source DIR/env.sh                     (exports HADOOP_CONF_DIR, CRUISE_HADOOP_DIR,
#                                          CRUISE_YARN__AM_REGISTER_JAR)
#   integration/hadoop/stop.sh [DIR]
#
# Needs Java 17 and Maven; the Hadoop jars are fetched by Maven into its
# local repository (~/.m2, cached between runs). All ports are free loopback
# ports chosen at start; DIR/cluster.env lists them (NN_HTTP, NN_RPC, RM_WEB,
# ...). Variables: NODEMANAGERS (2), NM_MEMORY_MB (6144 per NodeManager:
# accounting only, the memory checks are off), NM_VCORES (8 per NodeManager),
# HADOOP_START_TIMEOUT (300 s). The launcher's log is DIR/hadoop.log, the
# NodeManagers' DIR/logs/nodemanager-N.log, containers' DIR/nm-N/logs/.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${1:-${TMPDIR:-/tmp}/cruise-hadoop}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
NODEMANAGERS="${NODEMANAGERS:-2}"
NM_MEMORY_MB="${NM_MEMORY_MB:-6144}"
NM_VCORES="${NM_VCORES:-8}"
TIMEOUT="${HADOOP_START_TIMEOUT:-300}"
LOG="$DIR/hadoop.log"

if [ -f "$DIR/hadoop.pid" ] && kill -0 "$(cat "$DIR/hadoop.pid")" 2>/dev/null && [ -s "$DIR/ready" ]; then
    echo "hadoop: already running in $DIR (pid $(cat "$DIR/hadoop.pid"))" >&2
    exit 0
fi

command -v java >/dev/null || { echo "hadoop: java not found (Java 17 is needed)" >&2; exit 1; }
command -v mvn >/dev/null || { echo "hadoop: mvn not found (Maven is needed)" >&2; exit 1; }
if [ -z "${JAVA_HOME:-}" ]; then
    JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
fi
export JAVA_HOME

# Build the launcher and list its class path (Maven caches the jars).
CP_FILE="$HERE/target/classpath.txt"
if [ ! -s "$CP_FILE" ] || [ "$HERE/pom.xml" -nt "$CP_FILE" ] \
    || [ ! -s "$HERE/target/cruise-hadoop.jar" ] \
    || [ -n "$(find "$HERE/src" -newer "$HERE/target/cruise-hadoop.jar" -name '*.java')" ]; then
    echo "hadoop: building the launcher (first run downloads ~200 MB of Hadoop jars into ~/.m2)" >&2
    if ! (cd "$HERE" && nice -n 10 mvn -B -q package dependency:build-classpath \
            -Dmdep.outputFile="$CP_FILE" >"$DIR/mvn.log" 2>&1); then
        tail -30 "$DIR/mvn.log" >&2
        echo "hadoop: building the launcher failed; see $DIR/mvn.log" >&2
        exit 1
    fi
fi

# Java 17 closes packages that Hadoop's libraries (Guice, Jersey, the
# security code) reach into.
ADD_OPENS=""
for p in java.base/java.lang java.base/java.lang.reflect java.base/java.util \
         java.base/java.util.concurrent java.base/java.io java.base/java.net \
         java.base/java.nio java.base/sun.nio.ch java.base/java.security \
         java.base/javax.security.auth java.base/sun.security.util \
         java.security.jgss/sun.security.krb5; do
    ADD_OPENS="$ADD_OPENS --add-opens=$p=ALL-UNNAMED"
done
ADD_OPENS="${ADD_OPENS# }"

mkdir -p "$DIR/classpath-conf"
rm -f "$DIR/ready" "$DIR/cluster.env"
(
    cd "$DIR"
    exec nice -n 10 java -Xmx1g $ADD_OPENS \
        -Dcruise.add.opens="$ADD_OPENS" \
        -Dcruise.nm.memory.mb="$NM_MEMORY_MB" -Dcruise.nm.vcores="$NM_VCORES" \
        -Dhadoop.log.dir="$DIR/logs" -Dyarn.log.dir="$DIR/logs" \
        -cp "$DIR/classpath-conf:$HERE/target/cruise-hadoop.jar:$(cat "$CP_FILE")" \
        cruise.hadoop.Launcher "$DIR" "$NODEMANAGERS"
) >"$LOG" 2>&1 &
echo $! >"$DIR/hadoop.pid"

deadline=$(( $(date +%s) + TIMEOUT ))
while [ ! -s "$DIR/ready" ]; do
    if ! kill -0 "$(cat "$DIR/hadoop.pid")" 2>/dev/null; then
        grep -E "ERROR|Exception" "$LOG" | tail -15 >&2 || true
        echo "hadoop: the launcher exited before it was ready; see $LOG" >&2
        exit 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "hadoop: not ready after $TIMEOUT s; see $LOG (still running as pid $(cat "$DIR/hadoop.pid"); stop it with $HERE/stop.sh $DIR)" >&2
        exit 1
    fi
    sleep 0.5
done

echo "AM_REGISTER_JAR=$HERE/target/cruise-hadoop.jar" >>"$DIR/cluster.env"
# shellcheck disable=SC1091
. "$DIR/cluster.env"
# Ready means the RM answers REST and WebHDFS answers a listing.
for url in "http://$RM_WEB/ws/v1/cluster/info" "http://$NN_HTTP/webhdfs/v1/?op=GETFILESTATUS"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)
    if [ "$code" != 200 ]; then
        echo "hadoop: $url answered HTTP $code after the launcher said ready; see $LOG" >&2
        exit 1
    fi
done

cat >"$DIR/env.sh" <<ENV
export HADOOP_CONF_DIR="$DIR/hadoop-conf"
export CRUISE_HADOOP_DIR="$DIR"
# cruise submit runs the AM under cruise.hadoop.AmRegistrar (yarn.am_register_jar).
export CRUISE_YARN__AM_REGISTER_JAR="$HERE/target/cruise-hadoop.jar"
ENV
cat <<MSG
hadoop running in $DIR (pid $(cat "$DIR/hadoop.pid"), log $LOG)
  WebHDFS  http://$NN_HTTP   (hdfs://$NN_RPC)
  YARN RM  http://$RM_WEB    ($NODEMANAGERS NodeManagers, $NM_MEMORY_MB MB and $NM_VCORES vcores each)
next: source $DIR/env.sh
MSG
