"""Fleet figures (BENCHMARKS.md#fleet-figures-fleet-benchfleetpy): what one agent run costs the master, and the wire, per node.

For each kind of certificate -- the throwaway ECDSA ones (`pluginsync-master dev-certs`), Puppet-style
RSA 4,096 (bench/certs.py) and an RSA CA with a P-256 master key -- a master of its own serves the
bench environment with `index.publish = "explicit"` (only `pluginsync-master reindex` re-indexes,
so nothing but the measured run works in the master while it is measured), and one node runs
`pluginsync-agent sync` as a timer would, a new process each run, through a counting TCP relay
(bench/relay.py):

  initial  one run into an empty libdir (a new node), then one untimed no-op (warms what a node
           keeps between runs: its listing cache, and its TLS session where the agent keeps one)
  noop     --fleet-runs runs, nothing changed
  1%       --fleet-change-runs runs, each after 30 files changed (bench/vendor/mutate.py), the
           master re-indexed and the new listings asked for once (the per-change work every node
           shares, reported apart as "per change"), then the node's run

Per run: master CPU (exact, per thread from /proc/<pid>/task/*/schedstat, between the agent's start
and the relay seeing its connections closed; the master idle before each run), bytes up and down
through the relay (TLS records: handshakes, certificates, tickets; not TCP/IP headers), the agent's
wall and CPU time. Derived: nodes per 2-core master at a 30-minute interval = 2 x 1,800 s / CPU
per run. The master's TLS counters (its `[metrics]` port), where it has any, are kept as read.

A fourth column, "ECDSA, a rollout in its first wave", is the ECDSA master with a `[[rollout]]` policy
(ROLLOUT) and a second generation published before its no-op runs, so each of its requests is placed
(docs/rollouts.md#placement); its 1 % runs are not made (they depend on the node's wave). For it and the
plain ECDSA master, the 304 rate of bench/run.py's load figures (64 connections, `--load-seconds`) is
measured after the no-op runs: the Targets table compares both with and without the rollout.

Imported by bench/run.py, which also adds the Puppet Server column (`puppet_server_column`).
"""
import json, os, statistics, subprocess, urllib.request

import certs
from common import (LISTING_QUERY, LOAD, agent_config, cpu_between, cpu_seconds, free_port, https_conn, https_get,
                    log, master_config, reindex, start_master, stop, thread_cpu, timed_rusage, tls_context,
                    wait_idle)
from relay import CountingRelay

KINDS = [
    ("ecdsa", "throwaway ECDSA P-256 (dev-certs)"),
    ("rsa", "Puppet-style RSA 4,096"),
    ("rsa-p256", "RSA 4,096 CA, P-256 master key"),
    ("ecdsa-rollout", "ECDSA, a rollout in its first wave"),
]
# The rollout column (docs/rollouts.md): the ECDSA master with this policy on the bench environment,
# and a change published before the no-op runs, so every request is placed while two generations are
# served (the node is in the 1 % wave or, likelier, not; either way the master places it per request).
ROLLOUT = ('[[rollout]]\nenvironments = ["production"]\n'
           'waves = [ { after = "0s", percent = 1 }, { after = "24h", percent = 100 } ]\n')
# The 304 rate with and without a rollout (bench/run.py's "listing 304, 64 connections"), measured
# against the ECDSA masters of this scenario, one after the other in the same run.
RATE_KINDS = ("ecdsa", "ecdsa-rollout")
INTERVAL_S = 1800
CORES = 2


def nodes_per_master(cpu_s):
    return CORES * INTERVAL_S / cpu_s if cpu_s > 0 else float("inf")


def measured_run(cmd, pid, relay):
    """One agent run through the relay: master CPU, bytes each way, agent wall and CPU."""
    wait_idle(pid)
    u0, d0, n0 = relay.snapshot()
    c0 = thread_cpu(pid)
    wall, agent_cpu = timed_rusage(cmd)
    u1, d1, n1 = relay.snapshot()
    cpu = cpu_between(c0, thread_cpu(pid))
    return {"master_cpu_s": cpu, "up": u1 - u0, "down": d1 - d0, "connections": n1 - n0,
            "wall_s": wall, "agent_cpu_s": agent_cpu}


def summarise(runs):
    out = {"runs": len(runs)}
    for k in ("master_cpu_s", "up", "down", "connections", "wall_s", "agent_cpu_s"):
        xs = [r[k] for r in runs]
        out[k] = statistics.mean(xs) if k == "master_cpu_s" else statistics.median(xs)
    out["bytes"] = out["up"] + out["down"]
    out["master_cpu_s_median"] = statistics.median(r["master_cpu_s"] for r in runs)
    out["nodes_per_2core_master"] = nodes_per_master(out["master_cpu_s"])
    return out


def tls_counters(metrics_port):
    """The master's `pluginsync_master_tls*` series (handshakes, resumptions where it counts them)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as e:
        return {"error": str(e)}
    out = {}
    for line in text.splitlines():
        if line.startswith("pluginsync_master_tls") or ("resum" in line and not line.startswith("#")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def prime(port, ssl_dir, env):
    """The per-change work every node shares: the new listings of both mounts asked for once."""
    conn = https_conn(port, tls_context(ssl_dir, certs.NODE))
    for mount in ("plugins", "pluginfacts"):
        https_get(conn, f"/puppet/v3/file_metadatas/{mount}?{LISTING_QUERY}&environment={env}",
                  {"Accept": "application/json", "Accept-Encoding": "gzip"})
    conn.close()


def rate_304(a, port, ssl_dir):
    """Conditional listings (If-None-Match, answered 304) per second over 64 connections."""
    listing = f"https://localhost:{port}/puppet/v3/file_metadatas/plugins?{LISTING_QUERY}&environment=production"
    cmd = [LOAD, "--ca", f"{ssl_dir}/certs/ca.pem", "--cert", f"{ssl_dir}/certs/{certs.NODE}.pem",
           "--key", f"{ssl_dir}/private_keys/{certs.NODE}.pem", "--duration", f"{a.load_seconds}s",
           "--url", listing, "--connections", "64", "--if-none-match", "auto"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["rps"]


def measure(ctx, kind, ssl_dir):
    a = ctx.a
    work = ctx.work
    conf = os.path.join(work, f"fleet-{kind}.toml")
    mport = free_port()
    rollout = kind.endswith("-rollout")
    # 64 connections of one certificate for the 304 rate (docs/master.md#connection-limits).
    http = "max_connections_per_client = 0\n" if kind in RATE_KINDS else ""
    master_config(conf, ctx.envs, ssl_dir, publish="explicit", metrics=f"127.0.0.1:{mport}",
                  extra=ROLLOUT if rollout else "", http=http)
    master, port = start_master(conf)
    relay = CountingRelay(port).start()
    node = os.path.join(work, f"fleet-node-{kind}")
    cmd = agent_config(os.path.join(work, f"fleet-agent-{kind}.toml"), f"https://localhost:{relay.port}", node,
                       ssl_dir)
    out = {"certificates": {"master": certs.describe(ssl_dir, certs.SERVER), "node": certs.describe(ssl_dir, certs.NODE)}}
    try:
        os.sync()  # what the bench wrote is not the agent's to write back
        out["initial"] = summarise([measured_run(cmd, master.pid, relay)])
        if rollout:  # a second generation, published under the policy: the node is placed from now on
            ctx.mutate()
            reindex(conf, port, "production")
        timed_rusage(cmd)  # warm-up no-op, untimed
        log(f"fleet [{kind}]: {a.fleet_runs} no-op runs")
        t0 = cpu_seconds(master.pid)
        out["noop"] = summarise([measured_run(cmd, master.pid, relay) for _ in range(a.fleet_runs)])
        # The same from /proc/<pid>/stat's ticks over all the runs (idle waits included), as a check.
        out["noop"]["master_cpu_s_from_ticks"] = (cpu_seconds(master.pid) - t0) / a.fleet_runs
        if kind in RATE_KINDS:
            log(f"fleet [{kind}]: listing 304, 64 connections, {a.load_seconds} s")
            out["rate_304"] = rate_304(a, port, ssl_dir)
        # The rollout column measures placement on no-op runs; its node's 1 % runs depend on its wave.
        if not rollout:
            log(f"fleet [{kind}]: {a.fleet_change_runs} runs after a 1 % change")
            runs, per_change, content = [], [], []
            for _ in range(a.fleet_change_runs):
                changed = ctx.mutate()
                content.append(changed["content_bytes"])
                wait_idle(master.pid)
                c0 = thread_cpu(master.pid)
                reindex(conf, port, "production")
                prime(port, ssl_dir, "production")
                wait_idle(master.pid)
                per_change.append(cpu_between(c0, thread_cpu(master.pid)))
                runs.append(measured_run(cmd, master.pid, relay))
            out["1%"] = summarise(runs)
            out["1%"]["changed_files"] = changed["changed"]
            out["1%"]["changed_content_bytes"] = statistics.median(content)
            out["1%"]["overhead_bytes"] = out["1%"]["bytes"] - out["1%"]["changed_content_bytes"]
            out["per_change_master_cpu_s"] = statistics.median(per_change)
        out["tls_counters"] = tls_counters(mport)
    finally:
        relay.stop()
        stop(master)
    return out


def run(ctx, results):
    """Every certificate kind; results["fleet"][kind] = {initial, noop, 1%, ...}."""
    fleet = results.setdefault("fleet", {})
    log("fleet: making Puppet-style RSA 4,096 certificates (openssl)")
    rsa = certs.puppet_rsa(os.path.join(ctx.work, "ssl-rsa"))
    dirs = {"ecdsa": ctx.ssl, "rsa": rsa, "rsa-p256": certs.p256_master(rsa, os.path.join(ctx.work, "ssl-rsa-p256")),
            "ecdsa-rollout": ctx.ssl}
    for kind, label in KINDS:
        fleet[kind] = measure(ctx, kind, dirs[kind])
        fleet[kind]["label"] = label


def puppet_server_column(results, ps, cmd_for_port, psport, runs):
    """Puppet Server's column: a stock `puppet plugin download` (no-op) through a relay, its CPU
    (the JVM's, every thread) and bytes per run. `cmd_for_port(port)` is the Puppet command."""
    relay = CountingRelay(psport).start()
    try:
        cmd = cmd_for_port(relay.port)
        timed_rusage(cmd)  # untimed: the node is in sync
        log(f"fleet [Puppet Server]: {runs} no-op `puppet plugin download` runs")
        rs = [measured_run(cmd, ps.pid, relay) for _ in range(runs)]
    finally:
        relay.stop()
    col = summarise(rs)
    results.setdefault("fleet", {})["puppet-server"] = {"label": "Puppet Server 7 (its CA: RSA 4,096)", "noop": col}


def print_table(r):
    fleet = r.get("fleet")
    if not fleet:
        return
    cols = [k for k, _ in KINDS if k in fleet] + (["puppet-server"] if "puppet-server" in fleet else [])
    print("\n| fleet: per agent run, each a new process | " + " | ".join(fleet[c]["label"] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))

    def row(name, f):
        cells = []
        for c in cols:
            try:
                cells.append(f(fleet[c]))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("–")
        print(f"| {name} | " + " | ".join(cells) + " |")

    ms = lambda x: f"{x*1000:.2f} ms"
    row("master CPU per no-op run (mean)", lambda f: ms(f["noop"]["master_cpu_s"]))
    row("… the same from /proc/<pid>/stat ticks over all no-op runs", lambda f: ms(f["noop"]["master_cpu_s_from_ticks"]))
    row("master CPU per run after a 1 % change (mean)", lambda f: ms(f["1%"]["master_cpu_s"]))
    row("master CPU per change, shared by all nodes (re-index + first listings)",
        lambda f: ms(f["per_change_master_cpu_s"]))
    row("master CPU, initial sync of a new node", lambda f: ms(f["initial"]["master_cpu_s"]))
    row("nodes per 2-core master, no-op runs every 30 min", lambda f: f"{f['noop']['nodes_per_2core_master']:,.0f}")
    row("nodes per 2-core master, every run after a change",
        lambda f: f"{f['1%']['nodes_per_2core_master']:,.0f}")
    b = lambda x: f"{x:,.0f} B"
    row("bytes per no-op run, up / down (median)", lambda f: f"{b(f['noop']['up'])} / {b(f['noop']['down'])}")
    row("bytes per 1 % run, up / down (median)", lambda f: f"{b(f['1%']['up'])} / {b(f['1%']['down'])}")
    row("… of which the changed files' content (30 files)", lambda f: b(f["1%"]["changed_content_bytes"]))
    row("… the rest (listings, requests, TLS)", lambda f: b(f["1%"]["overhead_bytes"]))
    row("bytes, initial sync of a new node", lambda f: b(f["initial"]["bytes"]))
    row("TCP connections per no-op run", lambda f: f"{f['noop']['connections']:.0f}")
    row("listing 304, 64 connections", lambda f: f"{f['rate_304']:,.0f} req/s")
    row("agent wall time, no-op / 1 % (median)",
        lambda f: f"{f['noop']['wall_s']*1000:.0f} / {f['1%']['wall_s']*1000:.0f} ms")
    row("agent CPU, no-op / 1 % (median)",
        lambda f: f"{f['noop']['agent_cpu_s']*1000:.0f} / {f['1%']['agent_cpu_s']*1000:.0f} ms")
    counters = {c: fleet[c]["tls_counters"] for c in cols if "tls_counters" in fleet[c]}
    for c, v in counters.items():
        shown = ", ".join(f"{k} {val:g}" for k, val in v.items()) or "none exported"
        print(f"\nmaster TLS counters after the runs [{c}]: {shown}")
