#!/usr/bin/env bash
# Fault injection at scale: the agent killed with SIGKILL at
# random points of initial and incremental syncs, a fourth of them aimed at
# the switch, direct and through a throttled proxy: no partial file, no
# mixed tree (each destination and each kept generation the old tree or
# the new one exactly), no write outside, convergence on the next run
# (tests/e2e/agent_killed.rs); and masters killed
# mid-download with a replica or restarted 2 s later
# (tests/e2e/agent_failover.rs). CI runs the same tests with fewer points.
#
#   scripts/fault-inject.sh [POINTS] [FAILOVER_RUNS]
#
# POINTS kills per scenario (default 100; four scenarios: 400 kills),
# FAILOVER_RUNS master kills (default 100, as CI). Set FAULT_SEED=<seed>
# to replay a failure: every failing assertion prints its seed.
set -euo pipefail
cd "$(dirname "$0")/.."

points="${1:-100}"
failover_runs="${2:-100}"
cargo build --quiet --workspace --bins
export FAULT_POINTS="$points" FAILOVER_RUNS="$failover_runs"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# One test at a time: the kill points are fractions of a measured run, and
# runs measured under a neighbour's load are longer than the runs killed.
set +e
cargo test --quiet -p pluginsync-tests --test e2e -- \
    --nocapture --test-threads=1 agent_killed:: agent_failover:: 2>&1 |
    tee "$log" | grep --line-buffered -E 'kills|runs with|measured runs|^test result'
status="${PIPESTATUS[0]}"
set -e
if [ "$status" -ne 0 ]; then
    grep -E -A8 'panicked|^failures:' "$log" >&2
fi
exit "$status"
