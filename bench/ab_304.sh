#!/usr/bin/env bash
# A/B of the master's 304 path: the rate and the master's CPU per request of
# two or more master binaries, alternated, one master at a time.
#
#   python3 bench/run.py --scenarios load --no-build --no-puppet-server --keep --work DIR
#   bench/ab_304.sh DIR ROUNDS MASTER_A [MASTER_B ...]
#
# DIR is a bench work directory kept by `run.py --keep` (its tree, certificates
# and master.toml). Each round starts each master in turn on DIR/master.toml
# (plus `max_connections_per_client = 0` where the binary knows the key: the 64
# connections all present the one bench certificate), warms it with 4
# connections for 1 s, then runs `pluginsync-load --connections 64
# --if-none-match auto` for 5 s and reads the master's CPU time from
# /proc/PID/stat. Prints one line per run: binary, requests, req/s, µs of
# master CPU per request. The rate depends on what else the machine runs; the
# CPU per request much less (BENCHMARKS.md#targets-and-the-latest-figures).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,16p' "$0"; exit 64; }
work=$1; rounds=$2; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
load=${PLUGINSYNC_LOAD:-$root/target/release/pluginsync-load}
query=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import common; print(common.LISTING_QUERY)' "$root/bench")
tick=$(getconf CLK_TCK)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
creds=(--ca "$work/ssl/certs/ca.pem" --cert "$work/ssl/certs/bench-node.pem" --key "$work/ssl/private_keys/bench-node.pem")

one() {  # one() MASTER: one measured run
    local master=$1 conf=$tmp/master.toml log=$tmp/master.log pid port url t0 t1 out
    sed 's/^shutdown_grace = "0s"$/shutdown_grace = "0s"\nmax_connections_per_client = 0/' "$work/master.toml" > "$conf"
    "$master" check --config "$conf" >/dev/null 2>&1 || cp "$work/master.toml" "$conf"
    "$master" serve --config "$conf" > "$log" 2>&1 & pid=$!
    for _ in $(seq 1 300); do grep -q "listening on" "$log" && break; sleep 0.1; done
    port=$(grep -o 'listening on 127\.0\.0\.1:[0-9]*' "$log" | head -1 | cut -d: -f2)
    [ -n "$port" ] || { echo "error: $master did not start: $(tail -1 "$log")" >&2; kill "$pid"; return 1; }
    url="https://localhost:$port/puppet/v3/file_metadatas/plugins?$query&environment=production"
    "$load" "${creds[@]}" --url "$url" --connections 4 --duration 1s --if-none-match auto > /dev/null
    t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    out=$("$load" "${creds[@]}" --url "$url" --connections 64 --duration 5s --if-none-match auto)
    t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    kill "$pid"; wait "$pid" 2>/dev/null || true
    python3 -c 'import json, sys
d = json.loads(sys.argv[1]); cpu = (int(sys.argv[3]) - int(sys.argv[2])) / int(sys.argv[4])
n, rps = d["requests"], d["rps"]
print(f"{sys.argv[5]}\t{n}\t{rps:.0f} req/s\t{cpu * 1e6 / n:.1f} µs CPU/req")' \
        "$out" "$t0" "$t1" "$tick" "$master"
}

for _ in $(seq 1 "$rounds"); do
    for m in "$@"; do one "$m"; done
done
