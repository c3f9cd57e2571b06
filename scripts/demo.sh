#!/usr/bin/env bash
# The pluginsync demo: a master on the bundled example environment
# (etc/environments/production) with throwaway certificates on 127.0.0.1,
# port chosen by the kernel; then a sync from it. Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet --bins
bin="$PWD/target/debug"
work="$(mktemp -d)"
master_pid=""
cleanup() {
    if [ -n "$master_pid" ]; then kill "$master_pid" 2>/dev/null || true; wait "$master_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

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

url="https://localhost:$port/puppet/v3/file_metadatas/plugins?recurse=true&links=follow&checksum_type=sha256&source_permissions=use&environment=production"
echo "== GET /puppet/v3/file_metadatas/plugins (one entry per line)"
curl -sS --fail --cacert "$work/ssl/certs/ca.pem" --cert "$work/ssl/certs/demo-node.pem" \
    --key "$work/ssl/private_keys/demo-node.pem" "$url" | sed 's/},{"path"/},\n{"path"/g'
echo
