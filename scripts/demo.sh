#!/usr/bin/env bash
# The pluginsync demo: a master on the bundled example environment
# (etc/environments/production) with throwaway certificates on 127.0.0.1,
# port chosen by the kernel; an agent syncs a temporary libdir and facts.d
# from it, a file changes on the master, the agent syncs again. Prints each
# report. Leaves nothing behind.
#
# With --trust (needs `tuftool`), the same with signed generations
# (docs/trust.md#quick-start): throwaway keys, the master serving the
# metadata, the agent verifying; the change is refused until it is signed.
set -euo pipefail
cd "$(dirname "$0")/.."
trust=false
case "${1:-}" in
    --trust) trust=true ;;
    "") ;;
    *) echo "usage: scripts/demo.sh [--trust]" >&2; exit 64 ;;
esac
if $trust && ! command -v tuftool >/dev/null; then
    echo "error: --trust needs tuftool (cargo install --locked tuftool)" >&2
    exit 1
fi

# Release binaries when they were built (faster, what a fleet runs), else
# debug ones; either way cargo rebuilds what changed, and shows its progress
# (a first build compiles a few hundred crates: minutes, not a hang).
if [ -x target/release/pluginsync-master ] && [ -x target/release/pluginsync-agent ]; then
    profile=release
    echo "== cargo build --release --bins (release binaries are present; rebuilding what changed)"
    cargo build --release --bins
else
    profile=debug
    echo "== cargo build --bins (the first build takes a few minutes; cargo shows its progress)"
    cargo build --bins
fi
bin="$PWD/target/$profile"
work="$(mktemp -d)"
master_pid=""
cleanup() {
    if [ -n "$master_pid" ]; then kill "$master_pid" 2>/dev/null || true; wait "$master_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# "1 file", "2 files".
plural() {
    if [ "$1" -eq 1 ]; then echo "$1 $2"; else echo "$1 $3"; fi
}

# One agent run, its output as the agent prints it; then, when it created
# anything, the same count as a person reads it: the agent's summary counts
# every created entry, directories included.
sync_run() {
    "$bin/pluginsync-agent" sync --config "$work/agent.toml" | tee "$work/run.out"
    local files=0 dirs=0 path
    while read -r action entry; do
        [ "$action" = created ] || continue
        case "$entry" in
            plugins/*) path="$work/node/lib/${entry#plugins/}" ;;
            pluginfacts/*) path="$work/node/facts.d/${entry#pluginfacts/}" ;;
            *) continue ;;
        esac
        if [ -d "$path" ]; then dirs=$((dirs + 1)); else files=$((files + 1)); fi
    done < "$work/run.out"
    if [ "$files" -gt 0 ] && [ "$dirs" -gt 0 ]; then
        echo "   (created: $(plural "$files" file files) and $(plural "$dirs" directory directories))"
    elif [ "$files" -gt 0 ]; then
        echo "   (created: $(plural "$files" file files))"
    elif [ "$dirs" -gt 0 ]; then
        echo "   (created: $(plural "$dirs" directory directories))"
    fi
}

# A copy of the example environment, so the demo can change a file in it.
cp -r etc/environments "$work/environments"
"$bin/pluginsync-master" dev-certs --out "$work/ssl" --server-name localhost --agent demo-node >/dev/null
cat > "$work/master.toml" <<TOML
listen = ["127.0.0.1:0"]
environmentpath = ["$work/environments"]
[tls]
cert = "$work/ssl/certs/localhost.pem"
key = "$work/ssl/private_keys/localhost.pem"
ca = "$work/ssl/certs/ca.pem"
crl = "$work/ssl/crl.pem"
[http]
shutdown_grace = "0s"
TOML

# The deploy pipeline's signing step (docs/trust.md#the-signing-pipeline).
sign() {
    echo "== scripts/sign-generation.sh production"
    PLUGINSYNC_MASTER="$bin/pluginsync-master" scripts/sign-generation.sh \
        --config "$work/master.toml" --repo "$work/tuf/repo" --publish "$work/trust" \
        --targets-key "$work/tuf/keys/targets.pem" --snapshot-key "$work/tuf/keys/snapshot.pem" \
        --timestamp-key "$work/tuf/keys/timestamp.pem" production
}
if $trust; then
    echo "== scripts/trust-quickstart.sh (throwaway keys: root 2 of 3, targets, snapshot, timestamp)"
    scripts/trust-quickstart.sh "$work/tuf"
    mkdir "$work/trust"
    printf '[trust]\nmetadata = "%s"\n' "$work/trust" >> "$work/master.toml"
    sign
fi

echo "== pluginsync-master check"
"$bin/pluginsync-master" check --config "$work/master.toml"

"$bin/pluginsync-master" serve --config "$work/master.toml" 2>"$work/master.log" &
master_pid=$!
port=""
for _ in $(seq 1 100); do
    port="$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/master.log" | head -n1)"
    [ -n "$port" ] && break
    kill -0 "$master_pid" 2>/dev/null || { cat "$work/master.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$port" ] || { echo "error: master did not start" >&2; cat "$work/master.log" >&2; exit 1; }
echo "== master listening on https://localhost:$port"

cat > "$work/agent.toml" <<TOML
servers = ["https://localhost:$port"]
environment = "production"
libdir = "$work/node/lib"
factsdir = "$work/node/facts.d"
vardir = "$work/node/var"
[tls]
ssldir = "$work/ssl"
certname = "demo-node"
TOML
if $trust; then
    printf '[trust]\nroot = "%s"\n' "$work/tuf/root.json" >> "$work/agent.toml"
fi

echo
echo "== pluginsync-agent sync (first run: everything is new)"
sync_run

echo
echo "== pluginsync-agent sync (second run: in sync, prints nothing)"
sync_run

echo
echo "== on the master: change a fact, add a function, remove a provider"
env="$work/environments/production/modules"
echo "# changed by the demo" >> "$env/acme_base/lib/facter/acme_role.rb"
mkdir -p "$env/ntp/lib/puppet/functions"
printf 'Puppet::Functions.create_function(:ntp_peers) do\n  def ntp_peers\n    []\n  end\nend\n' > "$env/ntp/lib/puppet/functions/ntp_peers.rb"
rm "$env/ntp/lib/puppet/provider/ntp_server/ruby.rb"
sleep 1   # the master re-indexes within its 200 ms debounce
if $trust; then
    echo
    echo "== pluginsync-agent sync (the change is not signed: refused, exit 65, nothing changed)"
    "$bin/pluginsync-agent" sync --config "$work/agent.toml" || echo "   (exit $?)"
    echo
    sign
fi

echo
echo "== pluginsync-agent sync (third run: exactly those changes)"
sync_run

echo
echo "== pluginsync-agent report --format json (the last run, as saved in the vardir)"
"$bin/pluginsync-agent" report --config "$work/agent.toml" --format json
