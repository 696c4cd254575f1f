#!/usr/bin/env bash
# Benchmark: training throughput of every app with 1, 2 and 4 workers (one
# server each time) on the local runtime, the optimizer off so the split
# stays put; the ratio is to the 1-worker run of the same app in the same
# invocation. Each app trains on the data set it generates by default.
#
#   integration/bench/scaling.sh [EPOCHS] [REPS]
#
# Uses target/release/cruise (build it first: cargo build --release -p
# cruise-appmaster --bin cruise). On a 2-core machine more than two workers
# share the cores: the figures show what the framework costs, not a cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."
CRUISE="${CRUISE_BIN:-$PWD/target/release/cruise}"
EPOCHS="${1:-5}"
REPS="${2:-3}"
[ -x "$CRUISE" ] || { echo "scaling: $CRUISE not found; build it first" >&2; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/cruise-scaling.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "## Throughput vs workers, local runtime ($(nproc) cores, load average $load)"
echo
echo "### records/s (tokens/s for LDA) = records x epochs / training time; $EPOCHS epochs, median of $REPS"
echo
echo "| app | 1 worker | 2 workers | 4 workers | 2 vs 1 | 4 vs 1 |"
echo "|---|---|---|---|---|---|"
for app in mlr nmf lda lasso; do
    declare -A rate=()
    for w in 1 2 4; do
        runs=()
        for _ in $(seq "$REPS"); do
            out="$("$CRUISE" run --app "$app" -n $((w + 1)) -w "$w" -e "$EPOCHS" \
                --set optimizer.enabled=false --work-dir "$WORK/$app" --json --quiet 2>"$WORK/err")" \
                || { echo "scaling: cruise run --app $app -w $w failed:" >&2; cat "$WORK/err" >&2; exit 1; }
            runs+=("$(python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
# LDA counts tokens (loss terms), the others records.
n = s["final_stats"]["loss_terms"] if s["app"] == "lda" else s["records"]
print(n * len(s["epochs"]) / s["train_secs"])' <<<"$out")")
        done
        rate[$w]="$(printf '%s\n' "${runs[@]}" | sort -g | sed -n "$(( (REPS + 1) / 2 ))p")"
    done
    python3 - "$app" "${rate[1]}" "${rate[2]}" "${rate[4]}" <<'PY'
import sys
app, r1, r2, r4 = sys.argv[1], *map(float, sys.argv[2:])
print(f"| {app} | {r1:,.0f} | {r2:,.0f} | {r4:,.0f} | {r2 / r1:.2f}x | {r4 / r1:.2f}x |")
PY
    unset rate
done
