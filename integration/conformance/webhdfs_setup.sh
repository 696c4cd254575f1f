#!/usr/bin/env bash
# Installs the third-party WebHDFS clients that webhdfs_conformance.sh runs
# against the cruise-sim WebHDFS simulator, into a cache that later runs reuse:
#   - a Python venv with HdfsCLI (hdfs==2.7.3), fsspec and requests;
#   - Hadoop's own Java client: hadoop-client-api-*.jar and
#     hadoop-client-runtime-*.jar, plus slf4j-api-*.jar and jcl-over-slf4j-*.jar
#     (the logging APIs the shaded runtime leaves unshaded), taken
#     from the pyspark source distribution on PyPI (only those jars are kept;
#     the sdist is deleted);
#   - a JDK (javac), from Debian packages when missing and running as root.
#
# Cache: ${CRUISE_CACHE_DIR:-$HOME/.cache/cruise-rs}/{venv,hadoop-jars}.
# Prints the cache paths on success. Safe to re-run: it only fills what is missing.
set -euo pipefail

CACHE="${CRUISE_CACHE_DIR:-$HOME/.cache/cruise-rs}"
VENV="$CACHE/venv"
JARS="$CACHE/hadoop-jars"
PYSPARK_VERSION="${CRUISE_PYSPARK_VERSION:-4.3.0}"
HDFSCLI_VERSION="2.7.3"

log() { echo "webhdfs_setup: $*" >&2; }
die() { echo "webhdfs_setup: ERROR: $*" >&2; exit 1; }

mkdir -p "$CACHE"

# ---- Python clients --------------------------------------------------------
command -v python3 >/dev/null || die "python3 not found"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
if ! "$VENV/bin/python" - <<PY 2>/dev/null
import hdfs, fsspec, requests
assert hdfs.__version__ == "$HDFSCLI_VERSION", hdfs.__version__
PY
then
    log "installing hdfs==$HDFSCLI_VERSION fsspec requests into $VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "hdfs==$HDFSCLI_VERSION" fsspec requests \
        || die "pip install of the Python WebHDFS clients failed"
fi

# ---- JDK -------------------------------------------------------------------
if ! command -v javac >/dev/null || ! command -v java >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing a JDK (openjdk-17-jdk-headless)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless >/dev/null \
            || die "apt-get install openjdk-17-jdk-headless failed"
    else
        die "javac/java not found; install a JDK (17 or later)"
    fi
fi

# ---- Hadoop client jars ----------------------------------------------------
JAR_GLOBS=(hadoop-client-api-*.jar hadoop-client-runtime-*.jar slf4j-api-*.jar jcl-over-slf4j-*.jar)
have_jars() {
    local g
    for g in "${JAR_GLOBS[@]}"; do
        compgen -G "$JARS/$g" >/dev/null || return 1
    done
}
if ! have_jars; then
    tmp="$(mktemp -d "$CACHE/pyspark-download.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    # pip reads the sdist's metadata with the venv's own setuptools
    # (--no-build-isolation), which needs `wheel` for bdist_wheel; a fresh
    # venv has neither.
    "$VENV/bin/pip" install --quiet --disable-pip-version-check setuptools wheel \
        || die "pip install setuptools wheel failed"
    log "downloading the pyspark==$PYSPARK_VERSION source distribution (about 450 MB, once)"
    "$VENV/bin/pip" download --quiet --disable-pip-version-check \
        --no-binary :all: --no-deps --no-build-isolation --dest "$tmp" "pyspark==$PYSPARK_VERSION" \
        || die "pip download pyspark==$PYSPARK_VERSION failed"
    sdist="$(compgen -G "$tmp/pyspark-*.tar.gz" | head -n1)"
    [ -n "$sdist" ] || die "no pyspark sdist in $tmp"
    members=()
    for g in "${JAR_GLOBS[@]}"; do members+=("*/deps/jars/$g"); done
    log "extracting ${JAR_GLOBS[*]} from deps/jars/ of $(basename "$sdist")"
    tar -xzf "$sdist" -C "$tmp" --wildcards "${members[@]}" \
        || die "the pyspark sdist lacks one of deps/jars/{${JAR_GLOBS[*]}}"
    rm -rf "$JARS.partial"
    mkdir -p "$JARS.partial"
    mv "$tmp"/*/deps/jars/*.jar "$JARS.partial/"
    rm -rf "$JARS"
    mv "$JARS.partial" "$JARS"
    rm -rf "$tmp"
    trap - EXIT
fi
have_jars || die "Hadoop client jars missing from $JARS"

echo "venv=$VENV"
echo "jars=$JARS"
