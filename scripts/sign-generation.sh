#!/usr/bin/env bash
# Signs the generation of an environment as deployed now (docs/trust.md#the-signing-pipeline):
# the deploy pipeline's step after r10k (or the CI's deploy job). It computes
# the environment's canonical manifest with the masters' own code
# (`pluginsync-master manifest`), adds it to the TUF repository as the
# target `ENV.<generation id>.manifest` (docs/trust.md#targets), re-signs
# targets, snapshot and timestamp with `tuftool update`, and installs the
# new metadata into the repository and, with --publish, into the masters'
# `[trust] metadata` directory: the versioned files first, `timestamp.json`
# last by a rename, so a master never serves a timestamp naming a file it
# does not have. On any error: one line, a non-zero exit, nothing changed.
#
# With --refresh (and no environment) it only re-signs, for the timer that
# renews the timestamp before it expires (docs/trust.md#expiry-and-the-timer).
# With --rebuild it signs anew, with `tuftool create`, exactly the
# manifests kept in DIR/manifests: after removing one (a withdrawn
# generation) or after a new root replaced the targets key
# (docs/trust.md#rotation).
set -euo pipefail

me="sign-generation"
usage="usage: $me [--config FILE] --repo DIR [--publish DIR] [--targets-key KEY] [--snapshot-key KEY] [--timestamp-key KEY] (ENVIRONMENT | --refresh | --rebuild)"

die() {
    echo "$me: $*" >&2
    exit 1
}

config="${PLUGINSYNC_MASTER_CONFIG:-/etc/pluginsync/master.toml}"
repo="${PLUGINSYNC_TUF_REPO:-}"
publish="${PLUGINSYNC_TUF_PUBLISH:-}"
# A key is a file path or anything `tuftool` reads as a key source
# (aws-kms://…, aws-ssm://…).
targets_key="${PLUGINSYNC_TUF_TARGETS_KEY:-}"
snapshot_key="${PLUGINSYNC_TUF_SNAPSHOT_KEY:-}"
timestamp_key="${PLUGINSYNC_TUF_TIMESTAMP_KEY:-}"
# Expiries (docs/trust.md#key-ceremony): a deploy renews targets; the timer
# renews the timestamp daily.
targets_expires="${PLUGINSYNC_TUF_TARGETS_EXPIRES:-in 13 weeks}"
snapshot_expires="${PLUGINSYNC_TUF_SNAPSHOT_EXPIRES:-in 7 days}"
timestamp_expires="${PLUGINSYNC_TUF_TIMESTAMP_EXPIRES:-in 1 day}"
master="${PLUGINSYNC_MASTER:-pluginsync-master}"
tuftool="${TUFTOOL:-tuftool}"
env=""
mode=sign

while [ $# -gt 0 ]; do
    case "$1" in
        --config) config="${2:?$usage}"; shift 2 ;;
        --repo) repo="${2:?$usage}"; shift 2 ;;
        --publish) publish="${2:?$usage}"; shift 2 ;;
        --targets-key) targets_key="${2:?$usage}"; shift 2 ;;
        --snapshot-key) snapshot_key="${2:?$usage}"; shift 2 ;;
        --timestamp-key) timestamp_key="${2:?$usage}"; shift 2 ;;
        --refresh) mode=refresh; shift ;;
        --rebuild) mode=rebuild; shift ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) die "unknown option '$1' ($usage)" ;;
        *) [ -z "$env" ] || die "one environment at a time ($usage)"; env="$1"; shift ;;
    esac
done

if [ "$mode" != sign ]; then
    [ -z "$env" ] || die "--$mode re-signs what is signed: no environment"
else
    [ -n "$env" ] || die "no environment ($usage)"
    case "$env" in
        *[!a-zA-Z0-9_]*) die "'$env' is not an environment name" ;;
    esac
fi
[ -n "$repo" ] || die "no --repo (or PLUGINSYNC_TUF_REPO)"
[ -n "$targets_key" ] || die "no --targets-key (or PLUGINSYNC_TUF_TARGETS_KEY)"
[ -n "$snapshot_key" ] || die "no --snapshot-key (or PLUGINSYNC_TUF_SNAPSHOT_KEY)"
[ -n "$timestamp_key" ] || die "no --timestamp-key (or PLUGINSYNC_TUF_TIMESTAMP_KEY)"
command -v "$tuftool" >/dev/null || die "'$tuftool' not found (cargo install --locked tuftool)"
[ "$mode" != sign ] || command -v "$master" >/dev/null || die "'$master' not found"
[ -f "$repo/metadata/timestamp.json" ] || die "'$repo/metadata' holds no TUF repository (tuftool create makes one)"
[ -z "$publish" ] || [ -d "$publish" ] || die "--publish '$publish' is not a directory"
repo="$(cd "$repo" && pwd)"

# The highest N of the files `N.<role>.json` in directory $1.
highest() {
    local dir="$1" role="$2" best=0 f n
    for f in "$dir"/*."$role".json; do
        [ -e "$f" ] || continue
        n="${f##*/}"
        n="${n%%.*}"
        case "$n" in
            ''|*[!0-9]*) continue ;;
        esac
        [ "$n" -gt "$best" ] && best="$n"
    done
    echo "$best"
}

root_version="$(highest "$repo/metadata" root)"
[ "$root_version" -gt 0 ] || die "'$repo/metadata' has no N.root.json"
# targets, snapshot and timestamp move together: one version for all three,
# above any written before (a run that failed mid-way may have left one).
targets_version="$(highest "$repo/metadata" targets)"
snapshot_version="$(highest "$repo/metadata" snapshot)"
version=$(( (targets_version > snapshot_version ? targets_version : snapshot_version) + 1 ))

# Everything is made in a directory of its own beside the repository (the
# same file system: the installs below are renames), removed on exit.
work="$(mktemp -d "$repo/.sign.XXXXXX")" || die "cannot write in '$repo'"
trap 'rm -rf "$work"' EXIT
mkdir "$work/add"

if [ "$mode" = sign ]; then
    if ! "$master" manifest "$env" --config "$config" >"$work/manifest" 2>"$work/master.err"; then
        die "pluginsync-master manifest $env: $(tail -n 1 "$work/master.err")"
    fi
    id="$(sha256sum "$work/manifest" | cut -c1-64)"
    target="$env.$id.manifest"
    mv "$work/manifest" "$work/add/$target"
fi

# The signer's own repository is trusted as it is on disk: an expired
# timestamp (the timer missed a day) must not stop the job that renews it.
versions=(--targets-version "$version" --targets-expires "$targets_expires"
    --snapshot-version "$version" --snapshot-expires "$snapshot_expires"
    --timestamp-version "$version" --timestamp-expires "$timestamp_expires")
keys=(--key "$targets_key" --key "$snapshot_key" --key "$timestamp_key")
if [ "$mode" = rebuild ]; then
    [ -d "$repo/manifests" ] || die "'$repo/manifests' does not exist: nothing was signed by this script"
    cp -p "$repo"/manifests/*.manifest "$work/add/" 2>/dev/null || true
    tuf=(create --root "$repo/metadata/$root_version.root.json")
else
    tuf=(update --root "$repo/metadata/$root_version.root.json"
        --metadata-url "file://$repo/metadata/" --allow-expired-repo)
fi
if ! "$tuftool" "${tuf[@]}" "${keys[@]}" "${versions[@]}" \
    --add-targets "$work/add" --outdir "$work/out" >"$work/tuftool.log" 2>&1; then
    die "tuftool ${tuf[0]}: $(grep -v -e '^[= ]*$' -e WARNING -e '^Updating repo' "$work/tuftool.log" | tail -n 1)"
fi
for role in targets snapshot; do
    [ -s "$work/out/metadata/$version.$role.json" ] || die "tuftool wrote no $version.$role.json"
done

# Copies file $1 to $2 by a rename: readers see the old file or the new one.
# Readable by all: the metadata is public, and the masters' user reads it.
put() {
    local tmp="${2%/*}/.${2##*/}.new"
    if ! { cp "$1" "$tmp" && chmod 0644 "$tmp" && mv "$tmp" "$2"; }; then
        rm -f "$tmp"
        die "cannot write '$2'"
    fi
}

# Installs the metadata of $1 into $2: every versioned file $2 lacks, then
# timestamp.json. A versioned file $2 holds with other bytes is refused
# before anything is written: versioned files never change.
install_metadata() {
    local from="$1" to="$2" f name
    for f in "$from"/*.json; do
        name="${f##*/}"
        [ "$name" = timestamp.json ] && continue
        if [ -e "$to/$name" ] && ! cmp -s "$f" "$to/$name"; then
            case "$name" in
                *.root.json) continue ;; # the same root, serialized anew by tuftool
            esac
            die "'$to/$name' exists with other bytes: another signer wrote there"
        fi
    done
    for f in "$from"/*.json; do
        name="${f##*/}"
        [ "$name" = timestamp.json ] && continue
        [ -e "$to/$name" ] && continue
        put "$f" "$to/$name"
    done
    put "$from/timestamp.json" "$to/timestamp.json"
}

install_metadata "$work/out/metadata" "$repo/metadata"
# The signed manifests are kept beside the metadata: withdrawing a
# generation is `tuftool create` from the ones kept
# (docs/trust.md#withdrawing-a-generation).
if [ "$mode" = sign ]; then
    mkdir -p "$repo/manifests"
    put "$work/add/$target" "$repo/manifests/$target"
fi
[ -z "$publish" ] || install_metadata "$repo/metadata" "$publish"

if [ "$mode" != sign ]; then
    echo "re-signed version $version ($mode; timestamp expires $timestamp_expires)"
else
    echo "signed $env generation $id as $target, version $version${publish:+, published to $publish}"
fi
