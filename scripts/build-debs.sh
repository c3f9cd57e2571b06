#!/usr/bin/env bash
# Builds the Debian packages pluginsync-master and pluginsync-agent into
# target/debian/ (packaging/README.md). Needs cargo-deb:
#   cargo install cargo-deb --locked
# Steps: the release binaries; the man pages and completions generated from
# the clap definitions (pluginsync-xtask); the conffiles, which are etc/'s
# files with Debian's installed paths; then `cargo deb --no-build` per crate
# ([package.metadata.deb] in master/Cargo.toml and agent/Cargo.toml).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-deb >/dev/null; then
    echo "error: cargo-deb is not installed (cargo install cargo-deb --locked)" >&2
    exit 1
fi

target=${CARGO_TARGET_DIR:-target}
out=$target/release/packaging
rm -rf "$out"

cargo build --release --locked -p pluginsync-master -p pluginsync-agent
# The generator only prints text: a debug build (CI has built it already).
cargo build --locked -p pluginsync-xtask
"$target/debug/pluginsync-xtask" generate "$out" >/dev/null
# Debian policy 12.1: man pages compressed with gzip -9 (cargo-deb compresses
# only what it did not find under target/release/).
gzip -9n "$out"/man/*

# conffile SRC DST FROM TO...: SRC with each FROM line replaced by TO; a FROM
# that is not in SRC is an error (etc/ changed: update this list).
conffile() {
    python3 - "$@" <<'PY'
import sys
src, dst, *pairs = sys.argv[1:]
text = open(src).read()
for old, new in zip(pairs[::2], pairs[1::2]):
    if old not in text:
        sys.exit(f"error: {src} has no {old!r}: update scripts/build-debs.sh")
    text = text.replace(old, new)
open(dst, "w").write(text)
PY
}
mkdir -p "$out/etc"
conffile etc/master.toml "$out/etc/master.toml" \
    'environmentpath = ["/etc/puppetlabs/code/environments"]' \
    '# Debian'"'"'s Puppet codedir (puppetserver: /etc/puppet/code).
environmentpath = ["/etc/puppet/code/environments"]' \
    '# [generations]' '[generations]' \
    '# dir = "/var/lib/pluginsync/generations"' \
    '# The unit'"'"'s StateDirectory=pluginsync.
dir = "/var/lib/pluginsync/generations"'
# The agent's conffile sets nothing (puppet.conf and the defaults decide):
# its commented ssldir shows the default beside Debian's puppet.conf.
conffile etc/agent.toml "$out/etc/agent.toml" \
    '# ssldir = "/etc/puppetlabs/puppet/ssl"' \
    '# Debian'"'"'s Puppet ssldir (the unit may read it: CAP_DAC_READ_SEARCH).
# ssldir = "/var/lib/puppet/ssl"'

cargo deb --no-build --locked -p pluginsync-master
cargo deb --no-build --locked -p pluginsync-agent
ls -1 "$target"/debian/*.deb
