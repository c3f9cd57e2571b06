#!/usr/bin/env bash
# The key ceremony of docs/trust.md#quick-start, with throwaway keys, in one
# directory: three root keys (threshold 2), a targets key, a snapshot key
# and a timestamp key (RSA, made by `tuftool`); the root signed by two of
# the three root keys; an empty TUF repository made with `tuftool create`.
# What it leaves in DIR:
#
#   DIR/keys/{root1,root2,root3,targets,snapshot,timestamp}.pem
#   DIR/root.json                  the root the nodes install ([trust] root)
#   DIR/repo/metadata/             1.root.json, 1.targets.json, … timestamp.json
#
# Then: scripts/sign-generation.sh --repo DIR/repo --targets-key
# DIR/keys/targets.pem … ENV. For a real fleet the root keys are made and
# kept offline by different people (docs/trust.md#key-ceremony), never in
# one directory: these keys are for trying the workflow and for the tests.
set -euo pipefail

die() {
    echo "trust-quickstart: $*" >&2
    exit 1
}

[ $# -eq 1 ] || die "usage: trust-quickstart.sh DIR"
tuftool="${TUFTOOL:-tuftool}"
command -v "$tuftool" >/dev/null || die "'$tuftool' not found (cargo install --locked tuftool)"
mkdir -p "$1"
dir="$(cd "$1" && pwd)"
[ ! -e "$dir/root.json" ] || die "'$dir/root.json' exists: a quick start makes a new repository"
mkdir -p "$dir/keys" "$dir/empty"
chmod 0700 "$dir/keys"
log="$dir/tuftool.log"
: >"$log"

tuf() {
    "$tuftool" "$@" >>"$log" 2>&1 || die "tuftool $1 $2: $(tail -n 1 "$log")"
}

root="$dir/root.json"
tuf root init "$root"
tuf root expire "$root" 'in 52 weeks'
tuf root set-threshold "$root" root 2
tuf root set-threshold "$root" targets 1
tuf root set-threshold "$root" snapshot 1
tuf root set-threshold "$root" timestamp 1
for key in root1 root2 root3; do
    tuf root gen-rsa-key "$root" "$dir/keys/$key.pem" --role root
done
for role in targets snapshot timestamp; do
    tuf root gen-rsa-key "$root" "$dir/keys/$role.pem" --role "$role"
done
chmod 0600 "$dir"/keys/*.pem
# Two of the three root keys: the threshold.
tuf root sign "$root" -k "$dir/keys/root1.pem" -k "$dir/keys/root2.pem"
tuf create \
    --root "$root" \
    --key "$dir/keys/targets.pem" --key "$dir/keys/snapshot.pem" --key "$dir/keys/timestamp.pem" \
    --add-targets "$dir/empty" \
    --targets-version 1 --targets-expires 'in 13 weeks' \
    --snapshot-version 1 --snapshot-expires 'in 7 days' \
    --timestamp-version 1 --timestamp-expires 'in 1 day' \
    --outdir "$dir/repo"
rmdir "$dir/empty"
rm -f "$log"
echo "root: $root (install it on the nodes as [trust] root)"
echo "repository: $dir/repo (sign with scripts/sign-generation.sh --repo $dir/repo)"
