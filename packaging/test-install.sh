#!/usr/bin/env bash
# Installs the Debian packages built by scripts/build-debs.sh into a fresh
# Debian root and checks them as an operator would (packaging/README.md,
# "Testing the packages"): lintian on the host, then in the root: dpkg -i
# with the dependencies resolved by apt, the binaries at their installed
# paths, the man pages, the completions, the pluginsync user, the units
# verified and enabled, `pluginsync-master check` on the shipped config with
# throwaway certificates, the agent's first runs on a Puppet node (its
# puppet.conf naming the certname and server, the shipped agent.toml
# untouched) under the agent unit's sandbox settings, the plugins and facts
# landing where Debian's puppet reads them (its libdir and pluginfactdest,
# `puppet facts show` resolving them, and a stock `puppet agent -t` against
# a throwaway Puppet Server on the host resolving the synced custom fact),
# and a purge. One PASS/FAIL line per check; exits 1
# if any failed. Needs root, debootstrap, lintian and puppetserver; nothing is cached: the
# root is made anew from the Debian mirror each run and removed at the end,
# its mounts first, on success, failure or interrupt.
#
# Usage: packaging/test-install.sh [MASTER.deb AGENT.deb]
# Environment: MIRROR (default: the deb.debian.org mirror this host uses),
# SUITE (default: this host's codename).
set -uo pipefail
cd "$(dirname "$0")/.."

target=${CARGO_TARGET_DIR:-target}
master_deb=${1:-$(ls -1t "$target"/debian/pluginsync-master_*.deb 2>/dev/null | head -n1)}
agent_deb=${2:-$(ls -1t "$target"/debian/pluginsync-agent_*.deb 2>/dev/null | head -n1)}
for deb in "$master_deb" "$agent_deb"; do
    if [ -z "$deb" ] || [ ! -f "$deb" ]; then
        echo "error: no .deb to test (run scripts/build-debs.sh first, or name them)" >&2
        exit 2
    fi
done
for tool in debootstrap lintian; do
    if ! command -v "$tool" >/dev/null; then
        echo "error: $tool is not installed (apt-get install debootstrap lintian)" >&2
        exit 2
    fi
done
suite=${SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
mirror=${MIRROR:-http://deb.debian.org/debian}

failed=0
log=$(mktemp /tmp/pluginsync-test-install.XXXXXX.log)
# check NAME COMMAND...: runs the command (output to the log), prints PASS
# or FAIL with the name; on FAIL also the command's last lines.
check() {
    local name=$1
    shift
    local start
    start=$(wc -l <"$log")
    echo "== $name" >>"$log"
    if "$@" >>"$log" 2>&1; then
        echo "PASS $name"
    else
        echo "FAIL $name"
        tail -n +"$((start + 2))" "$log" | tail -n 15 | sed 's/^/    /'
        failed=$((failed + 1))
        return 1
    fi
}

root=$(mktemp -d /var/tmp/pluginsync-root.XXXXXX)
# It becomes the root's /: mktemp's 0700 would keep the pluginsync user out.
chmod 755 "$root"
# Unmounts everything under the root (deepest first), then removes it; a
# root that still has a mount is left in place rather than deleted through it.
cleanup() {
    local m
    for m in $(awk -v r="$root" '$2 == r || index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m"
    done
    if awk -v r="$root" '$2 == r || index($2, r "/") == 1 { found = 1 } END { exit !found }' /proc/mounts; then
        echo "error: $root still has mounts; not removed" >&2
    else
        rm -rf --one-file-system "$root"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

# --- on the host: lintian ---------------------------------------------------
for deb in "$master_deb" "$agent_deb"; do
    check "lintian reports no errors: $(basename "$deb")" lintian --fail-on error "$deb"
done

# --- a fresh root -----------------------------------------------------------
if ! check "debootstrap $suite from $mirror" \
    debootstrap --variant=minbase --include=man-db "$suite" "$root" "$mirror"; then
    echo "FAIL: cannot make a Debian root; nothing else checked"
    exit 1
fi
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
# No service may start inside the root (there is no systemd running there
# anyway; this also covers a host whose /run leaks in).
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mkdir -p "$root/tmp/debs"
cp "$master_deb" "$agent_deb" "$root/tmp/debs/"

install_debs() {
    # dpkg -i fails on the missing dependencies (systemd for the user);
    # apt-get -f install fetches them and finishes the configuration.
    in_root dpkg -i /tmp/debs/"$(basename "$master_deb")" /tmp/debs/"$(basename "$agent_deb")" || true
    in_root apt-get update -qq &&
        in_root env DEBIAN_FRONTEND=noninteractive apt-get -f install -y -qq --no-install-recommends &&
        [ "$(in_root dpkg-query -W -f='${Status}' pluginsync-master)" = "install ok installed" ] &&
        [ "$(in_root dpkg-query -W -f='${Status}' pluginsync-agent)" = "install ok installed" ]
}
check "dpkg -i both packages, dependencies resolved by apt-get -f install" install_debs

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
version_is() {
    [ "$(in_root "$1" --version)" = "$(basename "$1") $version" ]
}
check "/usr/sbin/pluginsync-master --version" version_is /usr/sbin/pluginsync-master
check "/usr/bin/pluginsync-agent --version" version_is /usr/bin/pluginsync-agent

man_renders() {
    local page=$1 text
    text=$(in_root env MANPAGER=cat MANWIDTH=80 man "$page") || return 1
    for section in NAME SYNOPSIS OPTIONS "EXIT STATUS" FILES; do
        grep -q "^$section" <<<"$text" || { echo "no $section in man $page"; return 1; }
    done
    grep -Eq '^ +78 +configuration error' <<<"$text" || { echo "no exit status 78 in man $page"; return 1; }
}
check "man pluginsync-agent renders (NAME … EXIT STATUS, FILES)" man_renders pluginsync-agent
check "man 8 pluginsync-master renders" man_renders pluginsync-master
subcommand_page() {
    in_root env MANPAGER=cat man pluginsync-agent-sync | grep -q -- --detailed-exitcodes
}
check "man pluginsync-agent-sync (a subcommand page) renders" subcommand_page

completions() {
    local bin
    for bin in pluginsync-master pluginsync-agent; do
        in_root bash -c "source /usr/share/bash-completion/completions/$bin && complete -p $bin" || return 1
        [ -s "$root/usr/share/zsh/vendor-completions/_$bin" ] || { echo "no zsh completion for $bin"; return 1; }
        [ -s "$root/usr/share/fish/vendor_completions.d/$bin.fish" ] || { echo "no fish completion for $bin"; return 1; }
    done
}
check "bash, zsh and fish completions installed (bash loads them)" completions

user_exists() {
    in_root getent passwd pluginsync && in_root getent group pluginsync &&
        in_root getent passwd pluginsync | grep -q ':/usr/sbin/nologin$'
}
check "the pluginsync system user and group exist (no login shell)" user_exists
# The master's generation store ([generations] dir in the shipped
# master.toml) exists before any unit ran, owned by the user the master runs
# as: a master started without systemd can write it.
store_owned() {
    [ "$(in_root stat -c '%U:%G %a' /var/lib/pluginsync/generations)" = "pluginsync:pluginsync 750" ] &&
        grep -q '^dir = "/var/lib/pluginsync/generations"$' "$root/etc/pluginsync/master.toml"
}
check "the generation store /var/lib/pluginsync/generations belongs to pluginsync (0750)" store_owned

conffiles() {
    in_root dpkg-query -W -f='${Conffiles}\n' pluginsync-master | grep -q '/etc/pluginsync/master.toml' &&
        in_root dpkg-query -W -f='${Conffiles}\n' pluginsync-agent | grep -q '/etc/pluginsync/agent.toml'
}
check "/etc/pluginsync/{master,agent}.toml are conffiles" conffiles

units="/usr/lib/systemd/system/pluginsync-master.service /usr/lib/systemd/system/pluginsync-agent.service /usr/lib/systemd/system/pluginsync-agent.timer"
verify_units() {
    local out
    # systemd-analyze prints its findings and still exits 0 for some: both
    # must be clean.
    # shellcheck disable=SC2086
    out=$(in_root systemd-analyze verify $units 2>&1) || { echo "$out"; return 1; }
    [ -z "$out" ] || { echo "$out"; return 1; }
}
check "systemd-analyze verify passes on the installed units" verify_units
# Neither binary can take the host (docs/operating.md#memory-and-tasks):
# both installed units set a finite MemoryMax= and TasksMax=.
capped_units() {
    local u v
    for u in pluginsync-master.service pluginsync-agent.service; do
        for v in MemoryMax TasksMax; do
            grep -Eq "^$v=[0-9]+[KMGT]?$" "$root/usr/lib/systemd/system/$u" ||
                { echo "$u: no finite $v="; return 1; }
        done
    done
}
check "both installed units cap memory and tasks (MemoryMax=, TasksMax=)" capped_units
enabled() {
    [ -L "$root/etc/systemd/system/timers.target.wants/pluginsync-agent.timer" ] &&
        [ -L "$root/etc/systemd/system/multi-user.target.wants/pluginsync-master.service" ]
}
check "the agent's timer and the master's service are enabled" enabled

# The shipped master config: refused without certificates, accepted with
# throwaway ones that the pluginsync user can read, run as that user.
check_fails_without_certs() {
    in_root /usr/sbin/pluginsync-master check
    [ $? -eq 78 ]
}
check "pluginsync-master check refuses the shipped config without certificates (exit 78)" \
    check_fails_without_certs
check_passes() {
    in_root /usr/sbin/pluginsync-master dev-certs --out /etc/pluginsync/ssl \
        --server-name puppet --agent node1.example.org --agent node7.example.org || return 1
    in_root chgrp -R pluginsync /etc/pluginsync/ssl/private_keys /etc/pluginsync/ssl/certs
    in_root chmod -R g+rX /etc/pluginsync/ssl/private_keys
    mkdir -p "$root/etc/puppet/code/environments"
    cp -r etc/environments/production "$root/etc/puppet/code/environments/"
    in_root runuser -u pluginsync -- /usr/sbin/pluginsync-master check
}
check "pluginsync-master check passes on the shipped config with throwaway certificates (as pluginsync)" \
    check_passes
# A store the pluginsync user cannot write (here handed to root) fails the
# check with one line, as `serve` would fail (the control: the check above).
check_refuses_unwritable_store() {
    local out code
    in_root chown root:root /var/lib/pluginsync/generations
    out=$(in_root runuser -u pluginsync -- /usr/sbin/pluginsync-master check 2>&1 >/dev/null)
    code=$?
    in_root chown pluginsync:pluginsync /var/lib/pluginsync/generations
    echo "$out"
    [ "$code" -eq 78 ] && grep -q '^error: generation store /var/lib/pluginsync/generations: ' <<<"$out"
}
check "pluginsync-master check refuses a generation store the pluginsync user cannot write (exit 78)" \
    check_refuses_unwritable_store
agent_config_loads() {
    # No run yet: `report` fails (1) after loading the config, where a bad
    # config would exit 78.
    in_root /usr/bin/pluginsync-agent report
    [ $? -eq 1 ]
}
check "the shipped agent.toml loads" agent_config_loads

# A Puppet node: Debian's puppet package, its puppet.conf with this node's
# certname and its server appended (on a free loopback port, where a master
# is started below); the ssldir is Puppet's default beside it,
# /var/lib/puppet/ssl, and the destinations are Puppet's libdir and
# pluginfactdest, as `puppet config print` gives them. The shipped
# agent.toml sets none of these, so they come from here.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
puppet_node() {
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        puppet || return 1
    [ -f "$root/etc/puppet/puppet.conf" ] || { echo "Debian's puppet ships no /etc/puppet/puppet.conf"; return 1; }
    printf '[main]\nserver = localhost\nserverport = %s\n[agent]\ncertname = node7.example.org\n' \
        "$port" >>"$root/etc/puppet/puppet.conf"
    grep -qw localhost "$root/etc/hosts" 2>/dev/null || echo '127.0.0.1 localhost' >>"$root/etc/hosts"
    local out dirs
    dirs=$(in_root puppet config print libdir pluginfactdest --section agent) || { echo "$dirs"; return 1; }
    echo "$dirs"
    grep -qx 'libdir = /var/cache/puppet/lib' <<<"$dirs" &&
        grep -qx 'pluginfactdest = /var/cache/puppet/facts.d' <<<"$dirs" || return 1
    out=$(in_root /usr/bin/pluginsync-agent config) || { echo "$out"; return 1; }
    echo "$out"
    grep -q '^certname = node7.example.org  (puppet.conf \[agent\])$' <<<"$out" &&
        grep -q "^servers = https://localhost:$port  (puppet.conf \[main\])$" <<<"$out" &&
        grep -q '^ssldir = /var/lib/puppet/ssl  (default)$' <<<"$out" &&
        grep -q '^libdir = /var/cache/puppet/lib  (default)$' <<<"$out" &&
        grep -q '^factsdir = /var/cache/puppet/facts.d  (default)$' <<<"$out"
}
check "with Debian's puppet and the shipped agent.toml, certname, servers, ssldir and Puppet's libdir and pluginfactdest come from puppet.conf" puppet_node

# The agent unit's capability bounding set (read from the installed unit)
# is what lets a root-run agent read a Puppet ssldir it does not own
# (Debian's: puppet:puppet 0750, keys 0640); with no capability it cannot.
# The sync goes to a closed loopback port: getting as far as connecting
# means every TLS file was read.
agent_sync_as_unit() {
    local bounding=$1
    in_root setpriv --bounding-set "$bounding" --inh-caps -all -- \
        /usr/bin/pluginsync-agent sync --noop --server https://127.0.0.1:9 2>&1
}
reads_puppet_ssldir() {
    local caps out
    caps=$(sed -n 's/^CapabilityBoundingSet=//p' "$root/usr/lib/systemd/system/pluginsync-agent.service" |
        tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ \+/,/g')
    [ -n "$caps" ] || { echo "no CapabilityBoundingSet= in the agent unit"; return 1; }
    mkdir -p "$root/var/lib/puppet"
    rm -rf "$root/var/lib/puppet/ssl"
    cp -a "$root/etc/pluginsync/ssl" "$root/var/lib/puppet/ssl"
    chown -R 4242:4242 "$root/var/lib/puppet/ssl"
    chmod 0750 "$root/var/lib/puppet/ssl" "$root/var/lib/puppet/ssl/private_keys"
    chmod 0640 "$root"/var/lib/puppet/ssl/private_keys/*
    out=$(agent_sync_as_unit "-all,$caps")
    echo "with $caps: $out"
    if grep -qi 'permission denied' <<<"$out" || ! grep -q '127.0.0.1:9' <<<"$out"; then
        return 1
    fi
    out=$(agent_sync_as_unit -all)
    echo "with no capability: $out"
    grep -qi 'permission denied' <<<"$out"
}
check "the agent unit's capabilities read a puppet-owned 0750 ssldir (none do not)" reads_puppet_ssldir

# --- the agent's first runs under its unit's sandbox -----------------------
# No systemd runs in this root (nor, in a container, on the host), so the
# installed unit's sandbox is rebuilt from its own settings, read from the
# installed file: ProtectSystem=strict (the whole root read-only but /dev
# and /proc) with ReadWritePaths= and StateDirectory= writable (a path
# with "-" skipped when missing, any other missing one failing the run as
# systemd's 226/NAMESPACE does), PrivateTmp= (a fresh /tmp and /var/tmp),
# ProtectHome= (an empty read-only /home and /root), NoNewPrivileges= and
# CapabilityBoundingSet=, then ExecStart= as root; its exit status must be
# 0 or one of SuccessExitStatus=. The other settings (PrivateDevices=,
# Restrict*=, SystemCallArchitectures=, ...) do not decide what may be
# written; `systemd-analyze verify` above checks them.
unit_file=$root/usr/lib/systemd/system/pluginsync-agent.service
unit_value() { sed -n "s/^$1=//p" "$unit_file" | tail -n1; }
# as_unit [RW_PATHS]: one run as the unit runs it; RW_PATHS replaces the
# unit's ReadWritePaths= (for the control below). Prints the run's output
# and its exit status as the last line.
as_unit() {
    local rw=${1-$(unit_value ReadWritePaths)} state= caps d
    for d in $(unit_value StateDirectory); do state="$state /var/lib/$d"; done
    caps=$(unit_value CapabilityBoundingSet | tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ \+/,/g')
    [ "$(unit_value ProtectSystem)" = strict ] && [ "$(unit_value NoNewPrivileges)" = yes ] &&
        [ "$(unit_value PrivateTmp)" = yes ] && [ "$(unit_value ProtectHome)" = yes ] &&
        [ -n "$caps" ] || { echo "the agent unit's sandbox settings changed: update test-install.sh"; return 1; }
    # shellcheck disable=SC2016
    unshare --mount --propagation private -- bash -c '
        set -e
        root=$1 rw=$2 caps=$3
        shift 3
        mount --rbind "$root" "$root"
        for p in $rw; do
            case $p in -*) p=${p#-}; optional=1 ;; *) optional= ;; esac
            if [ ! -d "$root$p" ]; then
                [ -n "$optional" ] && continue
                echo "ReadWritePaths=$p does not exist: the unit would fail (226/NAMESPACE)"
                exit 226
            fi
            mount --bind "$root$p" "$root$p"
        done
        mount -o remount,bind,ro "$root"
        for d in /tmp /var/tmp /home /root; do mount -t tmpfs -o mode=0755 tmpfs "$root$d"; done
        mount -o remount,ro "$root/home" && mount -o remount,ro "$root/root"
        exec chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
            setpriv --bounding-set "$caps" --inh-caps -all --no-new-privs -- "$@"
    ' as_unit "$root" "$rw $state" "-all,$caps" $(unit_value ExecStart) 2>&1
    echo "exit $?"
}
# The unit's run succeeded: 0 or one of SuccessExitStatus=.
unit_success() {
    local code
    code=$(tail -n1 <<<"$1" | sed -n 's/^exit //p')
    [ "$code" = 0 ] || grep -qw -- "$code" <<<"$(unit_value SuccessExitStatus)"
}

master_pid=
stop_master() {
    [ -n "$master_pid" ] && kill "$master_pid" 2>/dev/null && wait "$master_pid" 2>/dev/null
    master_pid=
}
# The shipped master config on the port puppet.conf names, as the pluginsync
# user (setpriv execs: $! is the master itself).
start_master() {
    { echo "listen = [\"127.0.0.1:$port\"]"; cat "$root/etc/pluginsync/master.toml"; } \
        >"$root/etc/pluginsync/master-test.toml"
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        setpriv --reuid pluginsync --regid pluginsync --init-groups -- \
        /usr/sbin/pluginsync-master serve --config /etc/pluginsync/master-test.toml \
        >>"$log" 2>&1 &
    master_pid=$!
    local i
    for i in $(seq 1 60); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        kill -0 "$master_pid" 2>/dev/null || { echo "the master exited"; return 1; }
        sleep 0.5
    done
    echo "the master is not listening on 127.0.0.1:$port after 30 s"
    return 1
}
trap 'stop_master; cleanup' EXIT
check "the master serves the shipped environment on 127.0.0.1:$port" start_master

# The first run: the shipped agent.toml untouched, the timer's command under
# the unit's sandbox; both mounts arrive in Puppet's libdir and
# pluginfactdest (Debian's /var/cache/puppet is puppet:puppet 0751: the
# unit's ReadWritePaths= and capabilities must let it write there), and a
# stock `puppet facts show` resolves the synced custom and external facts.
first_run() {
    local out facts
    out=$(as_unit)
    echo "$out"
    unit_success "$out" || return 1
    [ -f "$root/var/cache/puppet/lib/facter/ntp_synced.rb" ] &&
        [ -f "$root/var/cache/puppet/facts.d/datacenter.yaml" ] &&
        [ -x "$root/var/cache/puppet/facts.d/kernel_tuning.sh" ] || { echo "a mount was not synced"; return 1; }
    [ -d "$root/var/cache/puppet/.lib.pluginsync" ] || { echo "committed in place, not switched"; return 1; }
    facts=$(in_root puppet facts show acme_role datacenter --render-as json) || { echo "$facts"; return 1; }
    echo "$facts"
    grep -Eq '"acme_role": ?"unassigned"' <<<"$facts" &&
        grep -Eq '"datacenter": ?"fra1"' <<<"$facts"
}
check "first run as the unit: plugins and pluginfacts land in Puppet's libdir and pluginfactdest, and puppet facts show resolves them" first_run

# The pluginsync fact (docs/agent.md#the-pluginsync-fact): the run above,
# as the unit, wrote it in Debian's Facter directory (the package made
# it), 0644, naming the generation the run committed, and a stock `puppet
# facts show` reads it as a structured fact.
fact_written() {
    local fact generation file=$root/etc/facter/facts.d/pluginsync.json
    generation=$(in_root /usr/bin/pluginsync-agent report --format json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["generation"])')
    echo "the run committed $generation"
    [ -f "$file" ] || { echo "no $file"; return 1; }
    [ "$(stat -c %a "$file")" = 644 ] || { echo "$file is not 0644"; return 1; }
    fact=$(in_root puppet facts show pluginsync --render-as json) || { echo "$fact"; return 1; }
    echo "$fact"
    python3 -c 'import json, sys
f = json.loads(sys.argv[1])["pluginsync"]["production"]
assert f["generation"] == sys.argv[2] and sorted(f) == ["committed", "failing", "generation"], f' \
        "$fact" "$generation"
}
check "the run as the unit wrote the pluginsync fact in /etc/facter/facts.d, and puppet facts show reads it" fact_written

# The metrics textfile at the path the shipped agent.toml shows, in Debian's
# prometheus-node-exporter textfile directory, enabled as that file says
# (its two [metrics] lines uncommented): written by a run under the unit's
# sandbox, and not under the sandbox without that directory in
# ReadWritePaths= (the control: the sandbox is real).
textfile_written() {
    local out prom=/var/lib/prometheus/node-exporter/pluginsync.prom
    in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        prometheus-node-exporter || return 1
    [ -d "$root/var/lib/prometheus/node-exporter" ] || { echo "no textfile directory"; return 1; }
    grep -q "^# textfile = \"$prom\"$" "$root/etc/pluginsync/agent.toml" || { echo "agent.toml shows another textfile"; return 1; }
    sed -i 's/^# \[metrics\]$/[metrics]/; s/^# textfile = /textfile = /' "$root/etc/pluginsync/agent.toml"
    out=$(as_unit /var/lib/pluginsync)
    echo "control, only /var/lib/pluginsync writable: $out"
    if [ -e "$root$prom" ]; then echo "written without ReadWritePaths="; return 1; fi
    grep -q 'Read-only file system' <<<"$out" || return 1
    out=$(as_unit)
    echo "$out"
    unit_success "$out" || return 1
    grep -q '^pluginsync_agent_last_run_success 1$' "$root$prom" || return 1
    if grep -qi 'warn' <<<"$out"; then echo "the run warned"; return 1; fi
}
check "the metrics textfile the shipped agent.toml shows is written under the unit's sandbox" textfile_written

# The store the master filled while serving the runs above holds the files
# of environments [[authorization]] may restrict: nothing in it is readable
# by another user or writable by the group (docs/deploys.md#generations),
# and `check` as the master user finds no mode to warn about.
store_private() {
    local open out
    [ -n "$(in_root find /var/lib/pluginsync/generations/manifests -type f -print -quit)" ] ||
        { echo "the master stored no manifest"; return 1; }
    open=$(in_root find /var/lib/pluginsync/generations \( -perm /o=rwx -o -perm /g=w \) -print)
    [ -z "$open" ] || { echo "open to others: $open"; return 1; }
    out=$(chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
        setpriv --reuid pluginsync --regid pluginsync --init-groups -- \
        /usr/sbin/pluginsync-master check --config /etc/pluginsync/master.toml 2>&1)
    echo "$out"
    if grep -q '^warning: generation store .* is mode' <<<"$out"; then return 1; fi
}
check "the generation store, its indexes and state are the master user's (0750/0440/0640)" store_private
stop_master

# A stock `puppet agent -t` in the root resolves the synced custom fact: a
# throwaway Puppet Server on the host (scripts/puppetserver_sandbox.py, as
# the suite runs one; the root shares the host's loopback) with autosign,
# serving the environment the master served above (so Puppet's own
# pluginsync finds the libdir and pluginfactdest as they are and changes
# nothing there) and a manifest printing the fact. The agent asks for its
# certificate in an ssldir of its own (the one above holds the pluginsync
# master's CA). Its exit status is 0 or 2 (a change: the notify).
ps_dir='' ps_pid=''
stop_puppetserver() {
    [ -n "$ps_pid" ] && kill "$ps_pid" 2>/dev/null && wait "$ps_pid" 2>/dev/null
    ps_pid=
    [ -n "$ps_dir" ] && rm -rf "$ps_dir"
    ps_dir=
}
trap 'stop_puppetserver; stop_master; cleanup' EXIT
stock_agent_run() {
    local ps_port out code started=$SECONDS
    [ -f /usr/share/puppetserver/puppetserver.jar ] ||
        { echo "puppetserver is not installed on the host (apt-get install puppetserver)"; return 1; }
    ps_dir=$(mktemp -d /tmp/pluginsync-puppetserver.XXXXXX)
    ps_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 scripts/puppetserver_sandbox.py setup --dir "$ps_dir" --port "$ps_port" || return 1
    cp -r etc/environments/production "$ps_dir/code/environments/"
    # Without zz_legacy, whose acme_role.rb collides with acme_base's: the
    # master orders one directory's modules by name, Puppet by the order the
    # directory lists them (Pathname#children, unsorted), so on a collision
    # the two may serve different copies (docs/protocol.md#31-the-plugins-and-pluginfacts-mounts).
    # In a fleet the balancer sends the stock agent's plugin mounts to the
    # masters; here it talks to Puppet Server alone.
    rm -rf "$ps_dir/code/environments/production/modules/zz_legacy"
    mkdir -p "$ps_dir/code/environments/production/manifests"
    printf '%s\n' "notify { \"acme_role=\${facts['acme_role']}\": }" \
        >"$ps_dir/code/environments/production/manifests/site.pp"
    # Appended to the file's last section, [server].
    echo 'autosign = true' >>"$ps_dir/conf/puppet.conf"
    python3 scripts/puppetserver_sandbox.py serve --dir "$ps_dir" >>"$log" 2>&1 &
    ps_pid=$!
    python3 scripts/puppetserver_sandbox.py wait --dir "$ps_dir" --timeout 300 || return 1
    echo "Puppet Server ready after $((SECONDS - started)) s"
    out=$(in_root puppet agent -t --color false --server localhost --serverport "$ps_port" \
        --certname node7.example.org --environment production \
        --ssldir /var/lib/puppet/stock-ssl 2>&1)
    code=$?
    echo "$out"
    echo "puppet agent -t exited $code; $((SECONDS - started)) s with the server's start"
    [ "$code" = 0 ] || [ "$code" = 2 ] || return 1
    grep -q 'acme_role=unassigned' <<<"$out" || { echo "the run does not name the synced fact's value"; return 1; }
    if grep -q 'File\[/var/cache/puppet/' <<<"$out"; then
        echo "Puppet's own pluginsync changed what the agent synced"
        return 1
    fi
}
check "a stock puppet agent -t resolves the synced custom fact (Puppet Server on the host)" stock_agent_run
stop_puppetserver

# The agent's purge leaves the master's store (pluginsync-master is still
# installed); the master's purge then removes it and the emptied parent.
purge() {
    in_root dpkg --purge pluginsync-agent &&
        [ "$(ls -A "$root/var/lib/pluginsync")" = generations ] &&
        [ ! -e "$root/etc/systemd/system/timers.target.wants/pluginsync-agent.timer" ] &&
        [ ! -e "$root/etc/pluginsync/agent.toml" ] &&
        [ ! -e "$root/etc/facter/facts.d/pluginsync.json" ]
}
check "dpkg --purge pluginsync-agent removes its state, timer link, conffile and pluginsync fact" purge
purge_master() {
    in_root dpkg --purge pluginsync-master &&
        [ ! -e "$root/var/lib/pluginsync" ] &&
        [ ! -e "$root/etc/pluginsync/master.toml" ]
}
check "dpkg --purge pluginsync-master removes the generation store" purge_master

if [ "$failed" -eq 0 ]; then
    echo "test-install: all checks passed"
    rm -f "$log"
else
    echo "test-install: $failed check(s) failed (log: $log)"
    exit 1
fi
