#!/usr/bin/env bash
# What serving the web UI and /metrics costs a training job (issue #20).
#
#   integration/bench/ui_cost.sh cpu        AM CPU per request of /panels, / and
#                                           /metrics during a job that reconfigured
#   integration/bench/ui_cost.sh ab [PAIRS] median epoch time of the same job
#                                           without and with a poller fetching
#                                           /panels and /metrics every second on
#                                           one kept-alive connection, alternated
#                                           PAIRS times (default 8)
#
# CRUISE_BIN chooses the binary (default target/release/cruise, else
# target/debug/cruise). Needs curl and python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${CRUISE_BIN:-target/release/cruise}"
[ -x "$BIN" ] || BIN=target/debug/cruise
TMP=$(mktemp -d "${TMPDIR:-/tmp}/cruise-ui-cost.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
addr_of() { # stderr file of a `cruise run -v`: the status address, once printed
    for _ in $(seq 1 600); do
        a=$(grep -o 'status_addr=Some([0-9.:]*' "$1" 2>/dev/null | head -1 | sed 's/status_addr=Some(//') || true
        [ -n "$a" ] && { echo "$a"; return; }
        sleep 0.1
    done
    echo "no status address in $1" >&2; return 1
}

cpu() {
    work=$(mktemp -d "$TMP/c.XXXX")
    "$BIN" run -n 4 -w 2 --epochs 100000 --set mlr.generate_samples=40000 \
        --set optimizer.interval_ms=300 --set runtime.capacity_schedule=2:6 -v \
        --work-dir "$work" >"$work/out" 2>"$work/err" &
    pid=$!
    trap 'kill -INT $pid 2>/dev/null; wait $pid 2>/dev/null || true; rm -rf "$TMP"' EXIT
    addr=$(addr_of "$work/err")
    for _ in $(seq 1 600); do
        curl -s "http://$addr/status" | grep -q '"reconfigurations":\[{' && break
        sleep 0.1
    done
    sleep 3
    ticks() { awk '{print $14+$15}' "/proc/$pid/stat"; }
    measure() { # path n
        local t0 c0 t1 c1
        t0=$(date +%s.%N); c0=$(ticks)
        for _ in $(seq 1 "$2"); do curl -s -o /dev/null "http://$addr$1"; done
        t1=$(date +%s.%N); c1=$(ticks)
        echo "$1 $2 $t0 $t1 $c0 $c1"
    }
    idle() { local t0 c0 t1 c1; t0=$(date +%s.%N); c0=$(ticks); sleep "$1"; t1=$(date +%s.%N); c1=$(ticks); echo "base 0 $t0 $t1 $c0 $c1"; }
    echo "page $(curl -s "http://$addr/" | wc -c) bytes, metrics $(curl -s "http://$addr/metrics" | wc -c) bytes"
    for _ in 1 2; do idle 5; measure /panels 200; measure /metrics 200; measure / 100; done |
        TCK=$(getconf CLK_TCK) python3 -c '
import os, sys
tck = float(os.environ["TCK"])
rows = [l.split() for l in sys.stdin]
base = [(float(c1) - float(c0)) / tck / (float(t1) - float(t0)) for n, _, t0, t1, c0, c1 in rows if n == "base"]
b = sum(base) / len(base)
print("AM CPU while training, not served: %.3f cores" % b)
for n, k, t0, t1, c0, c1 in rows:
    if n == "base":
        continue
    k = int(k); wall = float(t1) - float(t0)
    c = (float(c1) - float(c0)) / tck - b * wall
    print("%-8s %3d requests: %.2f ms wall each (curl included), %.2f ms AM CPU each beyond that" % (n, k, wall / k * 1e3, c / k * 1e3))
'
}

one() { # none|poll: median epoch time (epochs 3..40) of one job
    work=$(mktemp -d "$TMP/w.XXXX")
    "$BIN" run --json --quiet -n 4 -w 3 -e 40 --set mlr.generate_samples=100000 \
        --set mlr.generate_nnz=200 --set mlr.step_size=4 --set optimizer.enabled=false -v \
        --work-dir "$TMP/data" >"$work/out.json" 2>"$work/err" &
    pid=$!
    n=0
    if [ "$1" = poll ]; then
        addr=$(addr_of "$work/err")
        # One process with one kept-alive connection, as a browser polls
        # (a curl per request would measure curl's start-up instead).
        n=$(python3 - "$addr" "$pid" <<'PY'
import http.client, os, sys, time
addr, pid = sys.argv[1], int(sys.argv[2])
host, port = addr.rsplit(":", 1)
c = http.client.HTTPConnection(host, int(port), timeout=10)
n = 0
while True:
    try:
        os.kill(pid, 0)
    except OSError:
        break
    try:
        for path in ("/panels", "/metrics"):
            c.request("GET", path)
            c.getresponse().read()
        n += 1
    except (OSError, http.client.HTTPException):
        c = http.client.HTTPConnection(host, int(port), timeout=10)
    time.sleep(1)
print(n)
PY
)
    fi
    wait $pid
    python3 -c "
import json, statistics
s = json.load(open('$work/out.json'))
print('$1', round(statistics.median(x['secs'] for x in s['epochs'][2:]), 4), '$n')"
}

case "${1:-}" in
    cpu) cpu ;;
    ab)
        for _ in $(seq 1 "${2:-8}"); do one none; one poll; done | python3 -c '
import statistics, sys
rows = [l.split() for l in sys.stdin]
none = [float(r[1]) for r in rows if r[0] == "none"]
poll = [float(r[1]) for r in rows if r[0] == "poll"]
print("without:", " ".join("%.3f" % x for x in none), "median %.4f s" % statistics.median(none))
print("polled: ", " ".join("%.3f" % x for x in poll), "median %.4f s" % statistics.median(poll))
d = [(p - n) / n * 100 for n, p in zip(none, poll)]
print("pairwise change %:", " ".join("%+.1f" % x for x in d), "median %+.1f%%" % statistics.median(d))
' ;;
    *) sed -n 2,13p "$0"; exit 2 ;;
esac
