#!/usr/bin/env bash
# Fuzzes each target for SECONDS (default 600) with libFuzzer, one after
# the other, niced; new inputs go to fuzz/corpus/<target>/ (the seeds in
# fuzz/seeds/<target>/ are read too), crashes to
# fuzz/libfuzzer/artifacts/<target>/, the log to
# fuzz/libfuzzer/logs/<target>.log, whose last lines give executions
# (#N), coverage (cov:) and features (ft:). Then minimizes each corpus
# with `cargo fuzz cmin` (by edges). Usage: fuzz/run.sh [SECONDS] [TARGET...]
# (all targets by default). Needs `cargo install cargo-fuzz`; see
# fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(relpath ignore request_path query frames listing agent_config master_config environment_conf puppet_conf)
fi
# Stable rustc with the nightly flags cargo-fuzz passes (-Z...):
export RUSTC_BOOTSTRAP=1
opts=(--fuzz-dir fuzz/libfuzzer -s none --debug-assertions -O)
nice -n 10 cargo fuzz build "${opts[@]}"
mkdir -p fuzz/libfuzzer/logs
for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t" "fuzz/libfuzzer/artifacts/$t"
    status=0
    nice -n 10 cargo fuzz run "${opts[@]}" "$t" \
        "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="fuzz/libfuzzer/artifacts/$t/" \
        >"fuzz/libfuzzer/logs/$t.log" 2>&1 || status=$?
    echo "== $t: exit $status"
    grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs|^stat::(number_of_executed_units|peak_rss_mb)|^SUMMARY|panicked' \
        "fuzz/libfuzzer/logs/$t.log" || true
    # Edges only (-use_counters=0): every covered edge keeps an input, but
    # inputs that only add hit-count buckets go (a corpus several times
    # smaller, for the repository).
    nice -n 10 cargo fuzz cmin "${opts[@]}" "$t" "fuzz/corpus/$t" -- -use_counters=0 \
        >>"fuzz/libfuzzer/logs/$t.log" 2>&1
    echo "   corpus after cmin: $(ls "fuzz/corpus/$t" | wc -l) files, $(du -sk "fuzz/corpus/$t" | cut -f1) KiB"
done
