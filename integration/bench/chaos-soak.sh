#!/usr/bin/env bash
# Chaos soak: runs the chaos test (integration/tests/chaos.rs: MLR, NMF,
# Lasso and LDA jobs each losing three SIGKILLed evaluators) ROUNDS times,
# each round with its own seed, and tallies the jobs that finished, failed
# and hung, the kills, and each job's quality against its undisturbed run.
#
#   integration/bench/chaos-soak.sh [ROUNDS] [FIRST_SEED]   (default 12, 1)
#
# A job hangs when one of the test's bounded waits runs out (it says
# "within" in its failure). Logs in target/chaos-soak/round-N.log.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS="${1:-12}"
FIRST_SEED="${2:-1}"
LOGS=target/chaos-soak
mkdir -p "$LOGS"

cargo build -q -p cruise-appmaster --bin cruise
cargo test -q -p cruise-integration --test chaos --no-run

# The chaos test's jobs, one per app.
JOBS=$(grep -c '_survives_random_kills' integration/tests/chaos.rs)
finished=0 failed=0 hung=0 kills=0
for ((r = 0; r < ROUNDS; r++)); do
    seed=$((FIRST_SEED + r))
    log="$LOGS/round-$r.log"
    CRUISE_CHAOS_SEED=$seed cargo test -q -p cruise-integration --test chaos \
        -- --nocapture --test-threads 1 >"$log" 2>&1 || true
    # "test result: ok. 4 passed; 0 failed; ..." (none if it did not build
    # or run: then all JOBS failed)
    read -r ok bad < <(awk -v jobs="$JOBS" '/^test result:/ { p = $4; f = $6 } END { print p + 0, (p + f == 0 ? jobs : f + 0) }' "$log")
    h=$(grep -c "within" "$log" || true)
    k=$(grep -c ": kill [0-9]" "$log" || true)
    finished=$((finished + ok))
    failed=$((failed + bad))
    hung=$((hung + (h < bad ? h : bad)))
    kills=$((kills + k))
    printf 'round %d (seed %d): %d jobs finished, %d failed, %d kills\n' "$r" "$seed" "$ok" "$bad" "$k"
    grep -E ": quality " "$log" | sed 's/^/    /' || true
done
printf '\n%d rounds: %d jobs finished, %d failed (%d of them hung), %d kills\n' \
    "$ROUNDS" "$finished" "$failed" "$hung" "$kills"
[ "$failed" = 0 ]
